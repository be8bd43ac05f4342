//! gzip of one backup into a temporary file beside it, which the caller
//! renames to `<backup>.gz` (so a half-written `.gz` never exists).
//!
//! The temporary file is `flock`ed from its creation (made holding the lock
//! file shared, so that no prune sees it before) until it is renamed or
//! removed: a prune that can lock one knows its writer is gone (killed) and
//! removes it. Compression gives up as soon as the compressed copy would
//! not be smaller than the backup, so it never takes more room than the
//! backup does (the cap counts each uncompressed backup twice for it).
//! Level: fast, because it runs inside a plugin invocation; logs still
//! shrink about tenfold.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;

use super::lock::{self, LockFile, Mode, WAIT};
use super::names;

/// A compressed copy waiting to be renamed; removed when dropped unless
/// [`Temp::persist`] was called.
#[derive(Debug)]
pub(super) struct Temp {
    path: PathBuf,
    /// Holds the `flock` that marks the file as being written.
    file: File,
    persisted: bool,
}

impl Temp {
    /// Renames the copy to `to`.
    pub fn persist(mut self, to: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, to)?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[derive(Debug)]
pub(super) enum Gzipped {
    /// The compressed copy, synced, in a temporary file.
    Done(Temp),
    /// It would not have been smaller: the backup stays as it is.
    NotSmaller,
    /// The lock file could not be had in time: not now.
    Busy,
}

/// What the bounded writer fails with once the limit is passed.
#[derive(Debug, thiserror::Error)]
#[error("the compressed copy is not smaller than the backup")]
struct NotSmaller;

/// Passes writes through until more than `left` bytes were written.
struct Bounded<W> {
    inner: W,
    left: u64,
}

impl<W: Write> Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let len = u64::try_from(buf.len()).unwrap_or(u64::MAX);
        if len >= self.left {
            return Err(io::Error::other(NotSmaller));
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Compresses the whole of `src`, the open backup `backup`, into a fresh
/// temporary file next to it.
pub(super) fn gzip(src: &File, backup: &Path, lock: &LockFile) -> io::Result<Gzipped> {
    let size = src.metadata()?.len();
    let Some(temp) = create_temp(backup, lock)? else {
        return Ok(Gzipped::Busy);
    };
    let written = (|| {
        let mut reader = src;
        reader.seek(SeekFrom::Start(0))?;
        let out = Bounded {
            inner: BufWriter::new(&temp.file),
            left: size,
        };
        let mut encoder = GzEncoder::new(out, Compression::fast());
        io::copy(&mut reader, &mut encoder)?;
        let mut out = encoder.finish()?;
        out.flush()?;
        temp.file.sync_data()
    })();
    match written {
        Ok(()) => Ok(Gzipped::Done(temp)),
        Err(e) if e.get_ref().is_some_and(|inner| inner.is::<NotSmaller>()) => {
            Ok(Gzipped::NotSmaller)
        }
        Err(e) => Err(e),
    }
}

/// A fresh temporary file for `backup`'s compressed copy, locked before
/// any prune can see it.
fn create_temp(backup: &Path, lock: &LockFile) -> io::Result<Option<Temp>> {
    let Some(_guard) = lock.lock(Mode::Shared, WAIT)? else {
        return Ok(None);
    };
    let path = names::temp(backup);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)?;
    let temp = Temp {
        path,
        file,
        persisted: false,
    };
    lock::try_lock(&temp.file, Mode::Exclusive).map_err(io::Error::from)?;
    Ok(Some(temp))
}

#[cfg(test)]
pub(super) fn gunzip(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(File::open(path)?).read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Bytes that do not compress (xorshift).
    pub fn noise(len: usize) -> Vec<u8> {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect()
    }

    fn lock_for(backup: &Path) -> LockFile {
        LockFile::open(&backup.with_file_name("cni.log")).unwrap()
    }

    #[test]
    fn round_trip_and_the_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let backup = dir.path().join("cni-2024-01-02T03-04-05.678.log");
        let text: Vec<u8> = (0..5000)
            .flat_map(|i| format!("2024-01-02T03:04:05Z  INFO line {i}\n").into_bytes())
            .collect();
        std::fs::write(&backup, &text).unwrap();
        let Gzipped::Done(temp) =
            gzip(&File::open(&backup).unwrap(), &backup, &lock_for(&backup)).unwrap()
        else {
            panic!("text compresses");
        };
        let name = temp.path.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with("cni-2024-01-02T03-04-05.678.log.gz.tmp-"),
            "{name}"
        );
        let other = File::open(&temp.path).unwrap();
        assert!(
            lock::try_lock(&other, Mode::Exclusive).is_err(),
            "the temporary file is locked while it waits"
        );
        let gz = names::compressed(&backup);
        let tmp_path = temp.path.clone();
        temp.persist(&gz).unwrap();
        assert!(!tmp_path.exists());
        assert!(std::fs::metadata(&gz).unwrap().len() < text.len() as u64 / 4);
        assert_eq!(gunzip(&gz).unwrap(), text);
    }

    #[test]
    fn incompressible_backups_stay_and_leave_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let backup = dir.path().join("cni-2024-01-02T03-04-05.678.log");
        std::fs::write(&backup, noise(100_000)).unwrap();
        let got = gzip(&File::open(&backup).unwrap(), &backup, &lock_for(&backup)).unwrap();
        assert!(matches!(got, Gzipped::NotSmaller), "{got:?}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "only the backup and the lock: {left:?}");
    }

    #[test]
    fn a_dropped_temp_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let backup = dir.path().join("cni-2024-01-02T03-04-05.678.log");
        std::fs::write(
            &backup,
            b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        )
        .unwrap();
        let Gzipped::Done(temp) =
            gzip(&File::open(&backup).unwrap(), &backup, &lock_for(&backup)).unwrap()
        else {
            panic!("compresses");
        };
        let path = temp.path.clone();
        assert!(path.exists());
        drop(temp);
        assert!(!path.exists());
    }
}
