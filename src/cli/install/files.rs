//! Files as the installer writes them: never in place. A new content goes
//! to a temporary file in the same directory, is synced, gets its mode,
//! and is renamed over the old one (then the directory is synced), so a
//! plugin call or a runtime that reads or executes the file sees the old
//! one or the new one, never a part; a running old binary keeps its inode
//! (no ETXTBSY: nothing opens it for writing).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What an install step did to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The file was created or replaced.
    Replaced,
    /// It was there with exactly this content and mode.
    Unchanged,
}

/// A file failed to be written (the path, and what the system said).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FileError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn at(path: &Path) -> impl Fn(io::Error) -> FileError + '_ {
    move |source| FileError {
        path: path.to_path_buf(),
        source,
    }
}

/// A name for a temporary file beside `path`, unique to this process.
fn temporary_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.calico-install.{}", std::process::id()))
}

fn sync_directory(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}

/// Whether `path` is a regular file with exactly `content` and the mode
/// bits `mode`.
fn holds(path: &Path, content: &mut dyn Read, len: u64, mode: u32) -> io::Result<bool> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if !meta.is_file() || meta.len() != len || meta.permissions().mode() & 0o7777 != mode {
        return Ok(false);
    }
    let mut existing = io::BufReader::new(File::open(path)?);
    let (mut a, mut b) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = content.read(&mut a)?;
        if n == 0 {
            return Ok(existing.read(&mut b[..1])? == 0);
        }
        existing.read_exact(&mut b[..n])?;
        if a[..n] != b[..n] {
            return Ok(false);
        }
    }
}

/// Puts `content` (from `write`) at `path` with `mode`: temporary file,
/// sync, rename, directory sync. The temporary file is removed on failure.
fn replace(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let temporary = temporary_beside(path);
    let _ = fs::remove_file(&temporary);
    let attempt = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        write(&mut file)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        // Closed before it takes the name: an exec of a file someone
        // holds open for writing fails with ETXTBSY.
        drop(file);
        fs::rename(&temporary, path)?;
        sync_directory(path)
    })();
    if attempt.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    attempt
}

/// Writes `content` to `path` with `mode` unless it holds exactly that.
pub fn write(path: &Path, content: &[u8], mode: u32) -> Result<Written, FileError> {
    if holds(path, &mut &content[..], content.len() as u64, mode).map_err(at(path))? {
        return Ok(Written::Unchanged);
    }
    replace(path, mode, |file| file.write_all(content)).map_err(at(path))?;
    Ok(Written::Replaced)
}

/// Copies the file `from` to `to` with `from`'s mode, unless `to` holds
/// exactly that already.
pub fn copy(from: &Path, to: &Path) -> Result<Written, FileError> {
    let meta = fs::metadata(from).map_err(at(from))?;
    let mode = meta.permissions().mode() & 0o7777;
    let mut source = File::open(from).map_err(at(from))?;
    if holds(to, &mut source, meta.len(), mode).map_err(at(to))? {
        return Ok(Written::Unchanged);
    }
    let mut source = File::open(from).map_err(at(from))?;
    replace(to, mode, |file| io::copy(&mut source, file).map(|_| ())).map_err(at(to))?;
    Ok(Written::Replaced)
}

/// Makes `path` a symbolic link to `target`, unless it is one already.
pub fn link(path: &Path, target: &Path) -> Result<Written, FileError> {
    if fs::read_link(path).is_ok_and(|t| t == target) {
        return Ok(Written::Unchanged);
    }
    let temporary = temporary_beside(path);
    let _ = fs::remove_file(&temporary);
    let attempt = std::os::unix::fs::symlink(target, &temporary)
        .and_then(|()| fs::rename(&temporary, path))
        .and_then(|()| sync_directory(path));
    if attempt.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    attempt.map_err(at(path))?;
    Ok(Written::Replaced)
}

/// Whether a directory exists and this process may create files in it.
pub fn writable_directory(dir: &Path) -> bool {
    dir.is_dir()
        && nix::unistd::access(
            dir,
            nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
        )
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn write_replaces_only_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("10-calico.conflist");
        assert_eq!(write(&path, b"{}", 0o644).unwrap(), Written::Replaced);
        let inode = fs::metadata(&path).unwrap();
        assert_eq!(write(&path, b"{}", 0o644).unwrap(), Written::Unchanged);
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap()),
            std::os::unix::fs::MetadataExt::ino(&inode),
            "an identical file is left alone"
        );
        assert_eq!(write(&path, b"{}", 0o600).unwrap(), Written::Replaced);
        assert_eq!(mode_of(&path), 0o600);
        assert_eq!(
            write(&path, b"{\"a\":1}", 0o600).unwrap(),
            Written::Replaced
        );
        assert_eq!(fs::read(&path).unwrap(), b"{\"a\":1}");
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
    }

    #[test]
    fn copy_keeps_the_mode_and_skips_an_identical_file() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        fs::write(&from, vec![7u8; 200_000]).unwrap();
        fs::set_permissions(&from, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(copy(&from, &to).unwrap(), Written::Replaced);
        assert_eq!(mode_of(&to), 0o755);
        assert_eq!(copy(&from, &to).unwrap(), Written::Unchanged);
        // Same size and mode, one byte different at the end: replaced.
        let mut other = vec![7u8; 200_000];
        other[199_999] = 8;
        fs::write(&from, &other).unwrap();
        assert_eq!(copy(&from, &to).unwrap(), Written::Replaced);
        assert_eq!(fs::read(&to).unwrap(), other);
    }

    #[test]
    fn link_replaces_a_file_with_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calico-ipam");
        fs::write(&path, b"old binary").unwrap();
        assert_eq!(link(&path, Path::new("calico")).unwrap(), Written::Replaced);
        assert_eq!(fs::read_link(&path).unwrap(), Path::new("calico"));
        assert_eq!(
            link(&path, Path::new("calico")).unwrap(),
            Written::Unchanged
        );
    }
}
