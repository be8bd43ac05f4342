//! `calico ipam pool add|list|remove`, the built binary against an embedded
//! store in a temp dir (no root, no cluster).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use calico_cni::datastore::ListFilter;
use calico_cni::datastore::Store;
use calico_cni::datastore::ipam_model::{
    AllocationAttribute, BlockAffinity, BlockAffinitySpec, IpamBlock, IpamBlockSpec,
};
use calico_cni::datastore::local::LocalStore;
use serde_json::{Value, json};

const CALICO: &str = env!("CARGO_BIN_EXE_calico");

/// A temp dir with a conflist whose calico plugin uses a store in it.
struct Bed {
    dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let bed = Bed { dir };
        let list = json!({
            "name": "k8s-pod-network",
            "cniVersion": "1.0.0",
            "plugins": [
                {"type": "portmap", "capabilities": {"portMappings": true}},
                {
                    "type": "calico",
                    "datastore_type": "local",
                    "local_datastore_path": bed.store_path(),
                    "nodename": "cli-node",
                    "ipam": {"type": "calico-ipam"}
                }
            ]
        });
        std::fs::write(bed.conflist(), list.to_string()).unwrap();
        bed
    }

    fn store_path(&self) -> PathBuf {
        self.dir.path().join("store").join("cni-datastore.db")
    }

    fn conflist(&self) -> PathBuf {
        self.dir.path().join("10-calico.conflist")
    }

    /// `calico ipam ARGS... --config <the conflist>`.
    fn ipam(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        let conf = self.conflist();
        all.extend(["--config", conf.to_str().unwrap()]);
        run(CALICO, &all, None)
    }

    fn store(&self) -> LocalStore {
        LocalStore::open(&self.store_path(), Duration::from_secs(5)).unwrap()
    }
}

fn run(binary: &str, args: &[&str], conf_dir: Option<&Path>) -> Output {
    let mut cmd = Command::new(binary);
    cmd.arg("ipam").args(args).env_clear();
    if let Some(dir) = conf_dir {
        cmd.env("CNI_CONF_DIR", dir);
    }
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {} {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Exit 1, nothing on stdout, one line on stderr; that line.
#[track_caller]
fn fails(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{} {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn pools_json(bed: &Bed) -> Value {
    serde_json::from_str(&ok(&bed.ipam(&["pool", "list", "-o", "json"]))).unwrap()
}

#[test]
fn add_list_remove() {
    let bed = Bed::new();
    let out = ok(&bed.ipam(&["pool", "add", "default-ipv4-ippool", "192.168.0.0/16"]));
    assert!(out.contains("default-ipv4-ippool"), "{out}");
    ok(&bed.ipam(&["pool", "add", "default-ipv6-ippool", "fd00:10:244:0:0::/64"]));
    ok(&bed.ipam(&[
        "pool",
        "add",
        "small",
        "10.9.0.0/24",
        "--block-size=28",
        "--disabled",
    ]));

    let table = ok(&bed.ipam(&["pool", "list"]));
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["NAME", "CIDR", "BLOCKSIZE", "DISABLED", "SELECTOR"],
            vec![
                "default-ipv4-ippool",
                "192.168.0.0/16",
                "26",
                "false",
                "all()"
            ],
            vec![
                "default-ipv6-ippool",
                "fd00:10:244::/64",
                "122",
                "false",
                "all()"
            ],
            vec!["small", "10.9.0.0/24", "28", "true", "all()"],
        ],
        "{table}"
    );
    // Columns line up.
    let at = |line: &str| line.find("all()").or_else(|| line.find("SELECTOR"));
    let starts: Vec<_> = table.lines().map(at).collect();
    assert!(starts.windows(2).all(|w| w[0] == w[1]), "{table}");

    let list = pools_json(&bed);
    assert_eq!(list["kind"], "IPPoolList");
    assert_eq!(list["apiVersion"], "projectcalico.org/v3");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    let v4 = &items[0];
    assert_eq!(v4["kind"], "IPPool");
    assert_eq!(v4["apiVersion"], "projectcalico.org/v3");
    assert_eq!(v4["metadata"]["name"], "default-ipv4-ippool");
    assert!(
        !v4["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        v4["spec"],
        json!({"cidr": "192.168.0.0/16", "vxlanMode": "Never", "ipipMode": "Never",
               "blockSize": 26, "nodeSelector": "all()",
               "allowedUses": ["Workload", "Tunnel"], "assignmentMode": "Automatic"})
    );
    assert_eq!(items[1]["spec"]["cidr"], "fd00:10:244::/64");
    assert_eq!(items[1]["spec"]["blockSize"], 122);
    assert_eq!(
        items[1]["spec"]["allowedUses"],
        json!(["Workload", "Tunnel"])
    );
    assert_eq!(items[2]["spec"]["blockSize"], 28);
    assert_eq!(items[2]["spec"]["disabled"], true);

    // The blockSize is stored explicitly, as Calico's client writes it.
    let stored = block_on(async {
        let store = bed.store();
        (&store as &dyn Store)
            .get_object(
                <calico_cni::datastore::ipam_model::IpPool as calico_cni::datastore::Resource>::KIND,
                "",
                "default-ipv6-ippool",
            )
            .await
            .unwrap()
            .unwrap()
    });
    assert_eq!(stored["spec"]["blockSize"], 122);
    assert_eq!(stored["spec"]["nodeSelector"], "all()");

    let out = ok(&bed.ipam(&["pool", "remove", "small"]));
    assert!(out.contains("small"), "{out}");
    let names: Vec<Value> = pools_json(&bed)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].clone())
        .collect();
    assert_eq!(
        names,
        [json!("default-ipv4-ippool"), json!("default-ipv6-ippool")]
    );

    let err = fails(&bed.ipam(&["pool", "remove", "small"]));
    assert!(err.contains("IPPool(small) does not exist"), "{err}");
}

#[test]
fn refuses_what_calico_refuses() {
    let bed = Bed::new();
    ok(&bed.ipam(&["pool", "add", "one", "10.0.0.0/16"]));

    let err = fails(&bed.ipam(&["pool", "add", "one", "10.0.0.0/16"]));
    assert!(err.contains("IPPool(one) already exists"), "{err}");
    let err = fails(&bed.ipam(&["pool", "add", "two", "10.0.64.0/18"]));
    assert!(
        err.contains("IPPool(two) CIDR 10.0.64.0/18 overlaps with IPPool(one) CIDR 10.0.0.0/16"),
        "{err}"
    );
    let err = fails(&bed.ipam(&["pool", "add", "three", "10.1.0.0/16", "--block-size", "19"]));
    assert!(
        err.contains("IPv4 block size must be between 20 and 32"),
        "{err}"
    );
    let err = fails(&bed.ipam(&["pool", "add", "three", "fd00::/64", "--block-size", "64"]));
    assert!(
        err.contains("IPv6 block size must be between 116 and 128"),
        "{err}"
    );
    let err = fails(&bed.ipam(&["pool", "add", "three", "10.1.0.0/28"]));
    assert!(err.contains("too small"), "{err}");
    let err = fails(&bed.ipam(&["pool", "add", "three", "10.1.0.1/16"]));
    assert!(err.contains("not strictly masked"), "{err}");
    let err = fails(&bed.ipam(&["pool", "add", "three", "10.1.0.0"]));
    assert!(err.contains("valid subnet"), "{err}");
    let err = fails(&bed.ipam(&["pool", "add", "Three", "10.1.0.0/16"]));
    assert!(err.contains("DNS-1123"), "{err}");

    // Only the first pool exists.
    assert_eq!(pools_json(&bed)["items"].as_array().unwrap().len(), 1);
}

#[test]
fn remove_is_refused_while_addresses_are_allocated() {
    let bed = Bed::new();
    ok(&bed.ipam(&["pool", "add", "busy", "10.20.0.0/16"]));
    ok(&bed.ipam(&["pool", "add", "other", "10.30.0.0/16"]));
    let store = bed.store();
    let cidr = "10.20.0.64/26";
    block_on(async {
        let s: &dyn Store = &store;
        let mut allocations = vec![None; 64];
        allocations[3] = Some(0);
        allocations[4] = Some(0);
        let mut block = IpamBlock::new(
            "10-20-0-64-26",
            IpamBlockSpec {
                cidr: cidr.into(),
                affinity: Some("host:cli-node".into()),
                allocations,
                unallocated: (0..64).filter(|i| *i != 3 && *i != 4).collect(),
                attributes: vec![AllocationAttribute {
                    handle_id: Some("k8s-pod-network.abc".into()),
                    ..AllocationAttribute::default()
                }],
                ..IpamBlockSpec::default()
            },
        );
        s.create(&mut block).await.unwrap();
        let mut affinity = BlockAffinity::new(
            "cli-node-10-20-0-64-26",
            BlockAffinitySpec {
                state: "confirmed".into(),
                node: "cli-node".into(),
                affinity_type: "host".into(),
                cidr: cidr.into(),
                deleted: "false".into(),
                ..BlockAffinitySpec::default()
            },
        );
        s.create(&mut affinity).await.unwrap();
        // A block of the other pool does not count for this one.
        let mut theirs = IpamBlock::new(
            "10-30-0-0-26",
            IpamBlockSpec {
                cidr: "10.30.0.0/26".into(),
                allocations: {
                    let mut a = vec![None; 64];
                    a[0] = Some(0);
                    a
                },
                ..IpamBlockSpec::default()
            },
        );
        s.create(&mut theirs).await.unwrap();
    });

    let err = fails(&bed.ipam(&["pool", "remove", "busy"]));
    assert!(err.contains("still has 2 addresses in use"), "{err}");
    assert!(err.contains(cidr), "{err}");
    assert_eq!(pools_json(&bed)["items"].as_array().unwrap().len(), 2);

    // Released: the pool goes, and its empty block and affinity with it.
    block_on(async {
        let s: &dyn Store = &store;
        let mut block = s
            .get::<IpamBlock>("", "10-20-0-64-26")
            .await
            .unwrap()
            .unwrap();
        block.spec.allocations = vec![None; 64];
        block.spec.unallocated = (0..64).collect();
        block.spec.attributes.clear();
        s.update(&mut block).await.unwrap();
    });
    let out = ok(&bed.ipam(&["pool", "remove", "busy"]));
    assert!(out.contains("removed IPPool busy"), "{out}");
    block_on(async {
        let s: &dyn Store = &store;
        let blocks = s.list::<IpamBlock>("", &ListFilter::All).await.unwrap();
        let names: Vec<&str> = blocks.iter().map(|b| b.metadata.name.as_str()).collect();
        assert_eq!(names, ["10-30-0-0-26"]);
        let affinities = s.list::<BlockAffinity>("", &ListFilter::All).await.unwrap();
        assert!(affinities.is_empty(), "{affinities:?}");
    });
    let names: Vec<Value> = pools_json(&bed)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, [json!("other")]);
}

#[test]
fn the_config_defaults_to_the_first_file_of_the_conf_dir() {
    let bed = Bed::new();
    let confdir = bed.dir.path().join("net.d");
    std::fs::create_dir_all(&confdir).unwrap();
    std::fs::copy(bed.conflist(), confdir.join("10-calico.conflist")).unwrap();
    // Later by name: never read.
    std::fs::write(confdir.join("20-broken.conflist"), "not json").unwrap();
    std::fs::write(confdir.join("00-readme.txt"), "not a config").unwrap();
    ok(&run(
        CALICO,
        &["pool", "add", "p", "10.7.0.0/16"],
        Some(&confdir),
    ));
    let table = ok(&run(CALICO, &["pool", "list"], Some(&confdir)));
    assert!(table.contains("10.7.0.0/16"), "{table}");
    // The same store as --config names.
    assert!(ok(&bed.ipam(&["pool", "list"])).contains("10.7.0.0/16"));

    let empty = bed.dir.path().join("empty.d");
    std::fs::create_dir_all(&empty).unwrap();
    let err = fails(&run(CALICO, &["pool", "list"], Some(&empty)));
    assert!(
        err.contains("no network config") && err.contains("--config"),
        "{err}"
    );

    // A config whose list has no calico plugin.
    let other = bed.dir.path().join("other.conflist");
    std::fs::write(
        &other,
        json!({"name": "n", "cniVersion": "1.0.0", "plugins": [{"type": "bridge"}]}).to_string(),
    )
    .unwrap();
    let err = fails(&run(
        CALICO,
        &["pool", "list", "--config", other.to_str().unwrap()],
        None,
    ));
    assert!(err.contains("no plugin of type \"calico\""), "{err}");
}

#[test]
fn bad_usage_prints_the_usage() {
    for args in [
        &[][..],
        &["pool"],
        &["pool", "frobnicate"],
        &["pool", "add", "only-a-name"],
        &["pool", "list", "--bogus"],
        &["pool", "add", "p", "10.0.0.0/16", "--block-size", "big"],
    ] {
        let out = run(CALICO, args, None);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{args:?}");
        // The problem and where the help is: two lines.
        let err = text(&out.stderr);
        assert!(err.starts_with("calico ipam: "), "{args:?}: {err}");
        assert!(
            err.ends_with("\nRun 'calico ipam --help' for usage.\n") && err.lines().count() == 2,
            "{args:?}: {err}"
        );
    }
    let help = run(CALICO, &["--help"], None);
    assert_eq!(help.status.code(), Some(0));
    assert!(text(&help.stdout).contains("calico ipam pool add NAME CIDR"));
}

#[test]
fn calico_ipam_has_no_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    let ipam = dir.path().join("calico-ipam");
    std::os::unix::fs::symlink(CALICO, &ipam).unwrap();
    // As Calico's calico-ipam: the arguments after the flags are ignored;
    // without CNI_COMMAND it says what it is, on stderr.
    let out = run(ipam.to_str().unwrap(), &["pool", "list"], None);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).starts_with("Calico CNI IPAM"),
        "{}",
        text(&out.stderr)
    );
}

/// `calico ipam ARGS... --config <the conflist>` with stderr a terminal (a
/// pty's slave): (exit code, stdout, what the terminal got).
fn ipam_on_terminal(bed: &Bed, args: &[&str]) -> (Option<i32>, String, String) {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty fills the two descriptors, owned here from then on.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let conf = bed.conflist();
    let mut cmd = Command::new(CALICO);
    cmd.arg("ipam")
        .args(args)
        .args(["--config", conf.to_str().unwrap()])
        .env_clear()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::from(slave));
    let child = cmd.spawn().unwrap();
    drop(cmd); // its copy of the slave: the master reads EIO at the end
    let out = child.wait_with_output().unwrap();
    let mut terminal = Vec::new();
    let mut master = std::fs::File::from(master);
    let mut chunk = [0u8; 4096];
    while let Ok(n) = master.read(&mut chunk) {
        if n == 0 {
            break;
        }
        terminal.extend_from_slice(&chunk[..n]);
    }
    (out.status.code(), text(&out.stdout), text(&terminal))
}

/// `show` and `check` say what they are doing on stderr: plain lines, a
/// phase each, when stderr is not a terminal; on a terminal one status line
/// rewritten in place and erased at the end. stdout is the same either way
/// (and the JSON still parses); the other commands say nothing.
#[test]
fn show_and_check_say_how_far_they_are_on_stderr() {
    let bed = Bed::new();
    let added = bed.ipam(&["pool", "add", "busy", "10.20.0.0/16"]);
    ok(&added);
    assert!(added.stderr.is_empty(), "{}", text(&added.stderr));
    let store = bed.store();
    block_on(async {
        let s: &dyn Store = &store;
        for i in 0..3u8 {
            let mut allocations = vec![None; 64];
            allocations[1] = Some(0);
            allocations[2] = Some(0);
            let cidr = format!("10.20.{i}.0/26");
            let mut block = IpamBlock::new(
                &format!("10-20-{i}-0-26"),
                IpamBlockSpec {
                    cidr,
                    affinity: Some("host:cli-node".into()),
                    allocations,
                    unallocated: (3..64).chain([0]).collect(),
                    attributes: vec![AllocationAttribute {
                        handle_id: Some(format!("k8s-pod-network.c{i}")),
                        ..AllocationAttribute::default()
                    }],
                    ..IpamBlockSpec::default()
                },
            );
            s.create(&mut block).await.unwrap();
        }
    });
    let read = [
        "reading the IPAM blocks, handles and pools...",
        "read 3 IPAM blocks, 0 handles and 1 pools; reading the workload endpoints...",
    ];
    let checked = [
        "checking blocks (3)...",
        "checking allocations (6)...",
        "checking addresses in use (0)...",
        "checking handles (0)...",
        "building the report (6)...",
    ];
    let summed = ["summing up the pools (1)..."];
    let cases: [(&[&str], &[&str]); 5] = [
        (&["show", "--show-blocks"], &summed),
        (&["show", "-o", "json"], &summed),
        (&["show", "--ip", "10.20.0.1"], &[]),
        (&["check", "--show-all-ips"], &checked),
        (&["check", "-o", "json"], &checked),
    ];
    for (args, phases) in cases {
        let what = format!("calico ipam {}", args[0]);
        let out = bed.ipam(args);
        let stdout = ok(&out);
        let stderr = text(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let expected: Vec<String> = read
            .iter()
            .chain(phases)
            .map(|p| format!("{what}: {p}"))
            .collect();
        assert_eq!(lines[..lines.len() - 1], expected, "{args:?}");
        assert!(
            lines[lines.len() - 1].starts_with(&format!("{what}: done in ")),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains('\r') && !stderr.contains('\x1b'),
            "{stderr:?}"
        );
        if args.contains(&"-o") {
            let _: Value = serde_json::from_str(&stdout).expect("stdout is JSON alone");
        }

        let (code, tty_stdout, terminal) = ipam_on_terminal(&bed, args);
        assert_eq!(code, Some(0), "{args:?}: {terminal:?}");
        assert_eq!(tty_stdout, stdout, "{args:?}: stdout is the same");
        assert!(
            terminal.starts_with(&format!(
                "\r{what}: reading the IPAM blocks, handles and pools...\x1b[K"
            )),
            "{args:?}: {terminal:?}"
        );
        assert!(
            terminal.ends_with("\x1b[K\r\x1b[K"),
            "{args:?}: {terminal:?}"
        );
        assert!(!terminal.contains('\n'), "{args:?}: {terminal:?}");
        assert!(!terminal.contains("done in"), "{args:?}: {terminal:?}");
    }
}
