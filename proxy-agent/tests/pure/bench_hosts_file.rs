//! The bare-metal bench's hosts file (`E2E_HOSTS`): the example in docs/bench
//! reads as documented; a wrong file is refused with the file and the field
//! named; commands through ssh reach the remote shell as the words given.

use std::path::{Path, PathBuf};

use crate::bench_hosts::{Host, HostsFile};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench/hosts.example.yaml")
}

fn error_of(yaml: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hosts.yaml");
    std::fs::write(&path, yaml).unwrap();
    let err = format!("{:#}", HostsFile::read(&path).unwrap_err());
    assert!(err.contains(&path.display().to_string()), "{err}");
    err
}

#[test]
fn the_documented_example_reads_with_every_role() {
    let hosts = HostsFile::read(&example()).unwrap();
    assert_eq!(hosts.node.host.run, ["ssh", "root@node.lab"]);
    assert_eq!(hosts.node.address.to_string(), "198.18.200.1");
    assert_eq!(hosts.node.pod_interfaces, ["enp1s0f0", "enp1s0f1"]);
    assert_eq!(
        hosts.node.socket_lb_cgroup.as_deref(),
        Some("/sys/fs/cgroup/kube-proxy-bench")
    );
    assert_eq!(hosts.servers.len(), 3);
    assert_eq!(
        hosts.servers[2].host.run,
        ["ssh", "root@server-b.lab", "ip", "netns", "exec", "srv-c"]
    );
    assert_eq!(hosts.client.bench.as_deref(), Some("/root/e2e/end_to_end"));
}

#[test]
fn a_wrong_hosts_file_names_the_field() {
    let good = std::fs::read_to_string(example()).unwrap();

    let err = error_of(&good.replace("  address: 198.18.200.1", "  address: node.lab"));
    assert!(err.contains("node.address"), "{err}");

    let err = error_of(&good.replace(
        "  cluster_cidr: 198.18.0.0/17",
        "  cluster_cidr: everything",
    ));
    assert!(err.contains("node.cluster_cidr"), "{err}");

    let err = error_of(&good.replace("  work: /var", "  wrok: /var"));
    assert!(err.contains("wrok"), "{err}");

    let two_servers = &good[..good.find("  - run: [ssh, root@server-b.lab, ip").unwrap()];
    let err = error_of(two_servers);
    assert!(
        err.contains("servers: three are needed") && err.contains("2 given"),
        "{err}"
    );

    let err = error_of(&good.replace(
        "client:\n  run: [ssh, root@client.lab]",
        "client:\n  run: []",
    ));
    assert!(err.contains("client.run"), "{err}");
}

#[test]
fn words_reach_a_remote_shell_as_given_and_a_local_prefix_unquoted() {
    let odd = ["it's", "a b", "$HOME", "\"q\""];
    // `sh -c` stands in for ssh's remote shell: it gets the words joined.
    let ssh = Host {
        run: vec!["ssh".into(), "node".into()],
        bench: None,
    };
    let command = ssh.command("printf", &["%s|", odd[0], odd[1], odd[2], odd[3]]);
    let words: Vec<String> = command
        .get_args()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(words.join(" "))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "it's|a b|$HOME|\"q\"|"
    );

    let local = Host {
        run: vec!["env".into()],
        bench: None,
    };
    let out = local
        .command("printf", &["%s|", odd[0], odd[1]])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "it's|a b|");
}
