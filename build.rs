//! Link options of the release `calico` binary.
//!
//! A CNI plugin is a short-lived process whose resident set is mostly the
//! text pages its code touches, so the functions an invocation runs are
//! packed together at the start of .text (link/symbol-order.txt, made by
//! scripts/symbol-order.sh). The order needs lld: on the musl target rustc
//! links with the C compiler's default linker, so this link is pointed at
//! the lld rustc ships (the `gcc-ld` wrapper beside rust-lld).
//! The binary is stripped here rather than by the profile, whose settings
//! are part of every symbol's hash: scripts/symbol-order.sh builds with
//! `CALICO_LINK_KEEP_SYMBOLS=1` and sees exactly the names this link orders.
//!
//! The same link writes its map, with mangled names, to `$OUT_DIR/calico.map`:
//! every symbol the binary holds, stripped or not, so that
//! scripts/check-symbol-order.sh can tell how much of the order file this
//! very binary still has without a second (unstripped, fat-LTO) build.
//!
//! It also names the commit built, for `calico -v` ([`commit`]).

fn main() {
    commit();
    let order = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("link/symbol-order.txt");
    println!("cargo::rerun-if-changed={}", order.display());
    println!("cargo::rerun-if-env-changed=CALICO_LINK_KEEP_SYMBOLS");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !release {
        return;
    }
    // Whether lld links the binary: rustc's default on x86_64 glibc; on
    // musl the lld rustc ships, where found (the C driver's default
    // linker knows no order file).
    let lld = if target == "x86_64-unknown-linux-gnu" {
        true
    } else if target.ends_with("-musl") {
        match rust_lld_wrapper() {
            Some(gcc_ld) => {
                println!("cargo::rustc-link-arg-bin=calico=-fuse-ld=lld");
                println!("cargo::rustc-link-arg-bin=calico=-B{}", gcc_ld.display());
                true
            }
            None => {
                println!("cargo::warning=rust-lld not found: the symbol order is not applied");
                false
            }
        }
    } else {
        false
    };
    if lld && order.exists() {
        println!(
            "cargo::rustc-link-arg-bin=calico=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        // Names this build no longer has (another crate version) are skipped;
        // rustc would not show lld's warnings anyway (its `linker_messages`
        // lint is allowed by default). scripts/check-symbol-order.sh counts
        // them from the map below and fails when too many are gone.
        println!("cargo::rustc-link-arg-bin=calico=-Wl,--no-warn-symbol-ordering");
        let out = std::env::var("OUT_DIR").expect("OUT_DIR");
        let map = std::path::Path::new(&out).join("calico.map");
        println!(
            "cargo::rustc-link-arg-bin=calico=-Wl,-Map={}",
            map.display()
        );
        // Mangled names in the map, as the order file has them (this also
        // leaves the linker's own messages mangled; the output is the same).
        println!("cargo::rustc-link-arg-bin=calico=-Wl,--no-demangle");
    }
    if std::env::var_os("CALICO_LINK_KEEP_SYMBOLS").is_none() {
        println!("cargo::rustc-link-arg-bin=calico=-Wl,--strip-all");
    }
}

/// The directory of rustc's `ld.lld` wrapper (it runs the toolchain's
/// rust-lld), for the C compiler driver's `-B`.
fn rust_lld_wrapper() -> Option<std::path::PathBuf> {
    let rustc = std::env::var_os("RUSTC")?;
    let out = std::process::Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = String::from_utf8(out.stdout).ok()?;
    let host = std::env::var("HOST").ok()?;
    let dir = std::path::Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(host)
        .join("bin/gcc-ld");
    dir.join("ld.lld").exists().then_some(dir)
}

/// `CALICO_CNI_COMMIT` for the crate: `git rev-parse --short HEAD` of the
/// work tree (the variable itself when set, as an image build without the
/// repository gives it), else "unknown". The script reruns when HEAD moves:
/// it watches the files git keeps HEAD and its branch in. The commit is a
/// string constant that one function prints (`env!`); the symbols' hashes
/// (cargo's metadata) do not depend on it, so the link and its symbol
/// order are the same whatever the commit.
fn commit() {
    println!("cargo::rerun-if-env-changed=CALICO_CNI_COMMIT");
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_string())
    };
    let commit = std::env::var("CALICO_CNI_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo::rustc-env=CALICO_CNI_COMMIT={commit}");
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        let path = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]);
        // Only paths that exist: cargo reruns the script on every build for
        // one that does not. A packed branch is watched by its directory,
        // where its next commit writes it.
        let Some(path) = path.map(std::path::PathBuf::from) else {
            continue;
        };
        let watch = if path.exists() {
            Some(path.as_path())
        } else if name.starts_with("refs/") {
            path.parent().filter(|p| p.exists())
        } else {
            None
        };
        if let Some(watch) = watch {
            println!("cargo::rerun-if-changed={}", watch.display());
        }
    }
}
