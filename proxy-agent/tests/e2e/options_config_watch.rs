//! A changed configuration file is checked as a restart would check it, which includes asking
//! this host whether the mode works (here `iptables`, which needs root); only a change that
//! would start makes the agent exit. The rest of the config watch is in the pure tier.

use std::path::Path;

use proxy_agent::options::file_watch::ConfigWatch;

use crate::options_common::*;

#[tokio::test]
async fn for_options_watches_both_files_and_checks_like_a_restart() {
    let dir = TempDir::new("cw-opts");
    let path = config_file(&dir, "mode: iptables\n");
    let ebpf = dir.file(
        "ebpf.yaml",
        "apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\n",
    );
    let o = opts(&["--config", &path, "--ebpf-config", ebpf.to_str().unwrap()]);
    assert_eq!(o.loaded_files.len(), 2);
    assert_eq!(
        o.args[1..3],
        ["--config".into(), std::ffi::OsString::from(&path)]
    );

    let mut w = ConfigWatch::for_options(&o).unwrap();
    assert_eq!(w.paths(), [Path::new(&path), ebpf.as_path()]);
    assert_quiet(&mut w, "nothing happened").await;
    // fails validation: a restart would not come up, so keep running
    write(
        Path::new(&path),
        &format!("{HEADER}mode: iptables\noomScoreAdj: 5000\n"),
    );
    assert_quiet(&mut w, "invalid by validation").await;
    write(
        Path::new(&path),
        &format!("{HEADER}mode: iptables\noomScoreAdj: 5\n"),
    );
    assert_eq!(
        assert_fires(&mut w, "valid change").await.path,
        Path::new(&path)
    );

    // our extension file counts too
    let o = opts(&["--config", &path, "--ebpf-config", ebpf.to_str().unwrap()]);
    let mut w = ConfigWatch::for_options(&o).unwrap();
    write(
        &ebpf,
        "apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\nxdpMode: generic\n",
    );
    assert_eq!(assert_fires(&mut w, "ebpf file").await.path, ebpf);
}
