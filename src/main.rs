//! The `calico` executable (also `calico-ipam` by name): collects argv, the
//! environment and stdin, runs one invocation and prints its outcome once.
//!
//! `main` is the C entry point (`no_main`): std's runtime start-up is left
//! out, and what of it a one-shot plugin needs is done here. Left out are
//! its stack-overflow guard, which reads /proc/self/maps to find the main
//! thread's stack and gives the main thread and every thread the call
//! spawns an alternate signal stack of its own (a mapping made and unmapped
//! per thread), all before the first byte of stdin is read; an overflow is
//! then a plain SIGSEGV.
#![no_main]

use std::io::Write;

use calico_cni::app::{self, Exit};
use calico_cni::cni::Error;
use calico_cni::cni::env::vars_from_os;
use calico_cni::cni::version::CURRENT;

fn print(exit: &Exit) {
    let _ = std::io::stdout().write_all(exit.stdout.as_bytes());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(exit.stderr.as_bytes());
}

#[cfg(target_env = "musl")]
mod musl_heap;

/// One heap for Rust and C on musl, the release target (src/musl_heap.rs).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: musl_heap::MuslHeap = musl_heap::MuslHeap;

/// What std's start-up does that this process relies on: a write to a
/// closed pipe fails with EPIPE rather than killing the process, and file
/// descriptors 0-2 are open (else the first file opened, the datastore's,
/// would become stdout and the result be written into it).
fn start_up() {
    // SAFETY: plain libc calls on this process's own signal disposition and
    // descriptors, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        });
        if libc::poll(fds.as_mut_ptr(), 3, 0) > 0 {
            for fd in fds.iter().filter(|f| f.revents & libc::POLLNVAL != 0) {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if null >= 0 && null != fd.fd {
                    libc::dup2(null, fd.fd);
                    libc::close(null);
                }
            }
        }
        // One malloc arena: the call's few threads (blocking pool, netns)
        // run one after another, and each thread's own arena costs a 64 MB
        // mapping grown page by page (≈60 page faults a call).
        #[cfg(target_env = "gnu")]
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// The process's arguments, as the C runtime gave them to `main`.
fn arguments(argc: libc::c_int, argv: *const *const libc::c_char) -> Vec<String> {
    (0..usize::try_from(argc).unwrap_or(0))
        .map(|i| {
            // SAFETY: the C runtime passes argc NUL-terminated strings in
            // argv, alive for the whole process.
            let arg = unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) };
            arg.to_string_lossy().into_owned()
        })
        .collect()
}

#[unsafe(no_mangle)]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    start_up();
    // A panic is a bug, but the runtime still gets a CNI error on stdout,
    // never a bare backtrace (release builds abort on panic, so the answer
    // is given here, before that).
    std::panic::set_hook(Box::new(|info| {
        let command = std::env::var("CNI_COMMAND").unwrap_or_default();
        let err = Error::internal(format!("Calico CNI panicked during {command}: {info}"));
        print(&Exit::error(&err, CURRENT));
        std::process::exit(1);
    }));
    // Neither argv nor the environment is trusted to be UTF-8. argv is read
    // from main's arguments: std keeps its own copy only when its start-up
    // runs, or on glibc.
    let args = arguments(argc, argv);
    let exit = match vars_from_os(std::env::vars_os()) {
        Ok(vars) => app::run(&args, vars, &mut std::io::stdin().lock()),
        Err(e) => Exit::error(&e, CURRENT),
    };
    print(&exit);
    std::process::exit(exit.code);
}
