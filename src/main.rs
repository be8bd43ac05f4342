//! The `calico` executable (also `calico-ipam` by name): collects argv, the
//! environment and stdin, runs one invocation and prints its outcome once.

use std::io::Write;
use std::panic::AssertUnwindSafe;

use calico_cni::app::{self, Exit};
use calico_cni::cni::Error;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let vars = std::env::vars().collect();
    let panic_message = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let slot = panic_message.clone();
    std::panic::set_hook(Box::new(move |info| {
        let text = format!("{info}");
        tracing::error!("panic: {text}");
        if let Ok(mut s) = slot.lock() {
            *s = text;
        }
    }));
    let exit = std::panic::catch_unwind(AssertUnwindSafe(|| {
        app::run(&args, vars, &mut std::io::stdin().lock())
    }))
    .unwrap_or_else(|_| {
        let text = panic_message.lock().map(|s| s.clone()).unwrap_or_default();
        let command = std::env::var("CNI_COMMAND").unwrap_or_default();
        Exit::error(
            &Error::Internal(format!("Calico CNI panicked during {command}: {text}")),
            calico_cni::cni::version::CURRENT,
        )
    });
    let _ = std::io::stdout().write_all(exit.stdout.as_bytes());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(exit.stderr.as_bytes());
    std::process::exit(exit.code);
}
