//! The `calico` executable (also `calico-ipam` by name): collects argv, the
//! environment and stdin, runs one invocation and prints its outcome once.

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

fn main() {
    // One malloc arena: the call's few threads (blocking pool, netns) run
    // one after another, and each thread's own arena costs a 64 MB mapping
    // grown page by page (≈60 page faults a call).
    // SAFETY: mallopt only tunes glibc's allocator, before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    // A panic is a bug, but the runtime still gets a CNI error on stdout,
    // never a bare backtrace (release builds abort on panic, so the answer
    // is given here, before that).
    std::panic::set_hook(Box::new(|info| {
        let command = std::env::var("CNI_COMMAND").unwrap_or_default();
        let err = Error::Internal(format!("Calico CNI panicked during {command}: {info}"));
        print(&Exit::error(&err, CURRENT));
        std::process::exit(1);
    }));
    // Neither argv nor the environment is trusted to be UTF-8.
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let exit = match vars_from_os(std::env::vars_os()) {
        Ok(vars) => app::run(&args, vars, &mut std::io::stdin().lock()),
        Err(e) => Exit::error(&e, CURRENT),
    };
    print(&exit);
    std::process::exit(exit.code);
}
