//! Network namespaces: open one by path, and run short synchronous work
//! inside it on a one-shot thread. The async runtime's own thread never
//! changes namespace; a thread that entered a pod namespace exits afterwards.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

use crate::dataplane::DataplaneError;

/// An open network namespace (the fd keeps it alive while we use it).
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Opens the namespace at `path`. `Ok(None)` when the path does not
    /// exist (a sandbox that is already gone).
    pub fn open(path: &Path) -> Result<Option<NetNs>, DataplaneError> {
        match File::open(path) {
            Ok(file) => {
                // A path that exists but is not a netns (e.g. a regular file)
                // must not be entered.
                let st = nix::sys::statfs::fstatfs(file.as_fd()).map_err(|e| {
                    DataplaneError::Netns(format!("failed to Statfs {path:?}: {e}"))
                })?;
                let ty = st.filesystem_type();
                if ty != nix::sys::statfs::NSFS_MAGIC && ty != nix::sys::statfs::PROC_SUPER_MAGIC {
                    return Err(DataplaneError::Netns(format!(
                        "{path:?} is not a network namespace (unknown FS magic {:#x})",
                        ty.0
                    )));
                }
                Ok(Some(NetNs {
                    file,
                    path: path.to_path_buf(),
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(DataplaneError::Netns(format!(
                "failed to open netns {path:?}: {e}"
            ))),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// [`Self::run`] awaited: the calling (runtime's) thread goes on while
    /// the fresh thread enters the namespace and works.
    pub async fn run_detached<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, DataplaneError> {
        let path = self.path.clone();
        let fd = self.file.try_clone().map_err(|e| {
            DataplaneError::Netns(format!("failed to duplicate the fd of netns {path:?}: {e}"))
        })?;
        let (answer, answered) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .spawn(move || {
                let _ = answer.send(enter(fd.as_fd(), &path).map(|()| work()));
            })
            .map_err(|e| DataplaneError::Netns(format!("no thread to enter the pod netns: {e}")))?;
        answered
            .await
            .map_err(|_| DataplaneError::Netns("a thread inside the pod netns panicked".into()))?
    }

    /// Runs `work` on a fresh thread that has entered this namespace; the
    /// thread exits when `work` returns, so no thread is ever left in it.
    pub fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> Result<T, DataplaneError> {
        let fd = self.file.as_fd();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    enter(fd, &self.path)?;
                    Ok(work())
                })
                .join()
                .map_err(|_| {
                    DataplaneError::Netns("a thread inside the pod netns panicked".into())
                })?
        })
    }
}

/// Moves the calling thread into the network namespace `fd` (at `path`).
fn enter(fd: BorrowedFd<'_>, path: &Path) -> Result<(), DataplaneError> {
    setns(fd, CloneFlags::CLONE_NEWNET)
        .map_err(|e| DataplaneError::Netns(format!("failed to enter netns {path:?}: {e}")))
}
