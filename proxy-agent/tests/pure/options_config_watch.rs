//! A changed configuration file makes the agent exit with upstream's error (config_rules.md §3),
//! including ConfigMap-style atomic updates (a `..data` symlink renamed over the old one). The
//! check a restart would make, which asks this host whether the mode works, is in the e2e tier.

use crate::options_common::*;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use proxy_agent::options::file_watch::{self, ConfigWatch};

fn watch_one(path: &Path) -> ConfigWatch {
    watch_with(path, |_| Ok(()))
}

/// Watches `path` with its current content as the loaded one; `accept` sees the new content.
fn watch_with(
    path: &Path,
    accept: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static,
) -> ConfigWatch {
    let loaded = std::fs::read(path).unwrap();
    let p = path.to_path_buf();
    ConfigWatch::new(vec![(path.to_path_buf(), loaded)], move || {
        accept(&std::fs::read_to_string(&p).unwrap_or_default())
    })
    .unwrap()
}

#[tokio::test]
async fn direct_write_exits() {
    let dir = TempDir::new("cw-write");
    let path = dir.file("config.yaml", &format!("{HEADER}mode: iptables\n"));
    let mut w = watch_one(&path);
    assert_quiet(&mut w, "nothing happened").await;
    // in place, like upstream's test: append to the open file
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"oomScoreAdj: -998\n").unwrap();
    let c = assert_fires(&mut w, "append").await;
    assert_eq!(c.path, path);
}

#[tokio::test]
async fn rename_over_the_path_exits() {
    let dir = TempDir::new("cw-rename");
    let path = dir.file("config.yaml", &format!("{HEADER}mode: iptables\n"));
    let mut w = watch_one(&path);
    assert_quiet(&mut w, "nothing happened").await;
    let tmp = dir.file(".config.yaml.tmp", &format!("{HEADER}mode: ipvs\n"));
    std::fs::rename(&tmp, &path).unwrap();
    assert_eq!(assert_fires(&mut w, "rename over").await.path, path);
}

/// kubelet's AtomicWriter layout: `<vol>/..<ts>/<key>`, `<vol>/..data -> ..<ts>`,
/// `<vol>/<key> -> ..data/<key>`.
struct ConfigMapVolume {
    dir: TempDir,
    generation: u32,
}

impl ConfigMapVolume {
    fn new(files: &[(&str, &str)]) -> Self {
        let mut v = ConfigMapVolume {
            dir: TempDir::new("cw-cm"),
            generation: 0,
        };
        let ts = v.write_generation(files);
        symlink(&ts, v.dir.path().join("..data")).unwrap();
        for (key, _) in files {
            symlink(format!("..data/{key}"), v.dir.path().join(key)).unwrap();
        }
        v
    }
    fn write_generation(&mut self, files: &[(&str, &str)]) -> String {
        self.generation += 1;
        let ts = format!("..2024_05_01_10_00_0{}.12345", self.generation);
        std::fs::create_dir(self.dir.path().join(&ts)).unwrap();
        for (key, text) in files {
            write(&self.dir.path().join(&ts).join(key), text);
        }
        ts
    }
    /// An update as kubelet does it: new directory, `..data_tmp` renamed over `..data`, old
    /// directory removed.
    fn update(&mut self, files: &[(&str, &str)]) {
        let old = std::fs::read_link(self.dir.path().join("..data")).unwrap();
        let ts = self.write_generation(files);
        let tmp = self.dir.path().join("..data_tmp");
        symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
        std::fs::remove_dir_all(self.dir.path().join(old)).unwrap();
    }
    fn path(&self, key: &str) -> PathBuf {
        self.dir.path().join(key)
    }
    fn current_dir(&self) -> PathBuf {
        self.dir
            .path()
            .join(std::fs::read_link(self.dir.path().join("..data")).unwrap())
    }
}

#[tokio::test]
async fn configmap_update_exits() {
    let v1 = format!("{HEADER}mode: iptables\n");
    let mut cm = ConfigMapVolume::new(&[("config.conf", &v1), ("other", "a")]);
    let path = cm.path("config.conf");
    let mut w = watch_one(&path);
    assert_quiet(&mut w, "nothing happened").await;

    // an update that only changes another key swaps ..data too, but our content is the same
    cm.update(&[("config.conf", &v1), ("other", "b")]);
    assert_quiet(&mut w, "same content behind a new ..data").await;

    let v2 = format!("{HEADER}mode: nftables\n");
    cm.update(&[("config.conf", &v2), ("other", "b")]);
    assert_eq!(
        assert_fires(&mut w, "..data swap").await.path,
        path,
        "reported under the path given, not the timestamped target"
    );
}

#[tokio::test]
async fn watches_follow_the_configmap_to_its_new_directory() {
    let v1 = format!("{HEADER}mode: iptables\n");
    let mut cm = ConfigMapVolume::new(&[("config.conf", &v1)]);
    let path = cm.path("config.conf");
    let mut w = watch_one(&path);
    cm.update(&[("config.conf", &v1)]);
    assert_quiet(&mut w, "same content").await;
    // the old inode is gone; a write to the file now behind the path must still be seen
    write(
        &cm.current_dir().join("config.conf"),
        &format!("{HEADER}mode: ipvs\n"),
    );
    assert_fires(&mut w, "write behind the new ..data").await;
}

#[tokio::test]
async fn other_events_are_ignored() {
    let dir = TempDir::new("cw-ignore");
    let text = format!("{HEADER}mode: iptables\n");
    let path = dir.file("config.yaml", &text);
    let mut w = watch_one(&path);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let _ = std::fs::read(&path).unwrap();
    dir.file("unrelated.yaml", "x");
    std::fs::rename(dir.path().join("unrelated.yaml"), dir.path().join("moved")).unwrap();
    assert_quiet(&mut w, "chmod, read, other files").await;
    write(&path, &text);
    assert_quiet(&mut w, "a write of the same bytes").await;
    let tmp = dir.file("same.tmp", &text);
    std::fs::rename(&tmp, &path).unwrap();
    assert_quiet(&mut w, "an atomic replace with the same bytes").await;
    std::fs::remove_file(&path).unwrap();
    assert_quiet(&mut w, "removal (ignored, as upstream)").await;
    write(&path, &format!("{HEADER}mode: ipvs\n"));
    assert_fires(&mut w, "recreated with new content").await;
}

#[tokio::test]
async fn content_that_would_not_load_keeps_the_running_config() {
    let dir = TempDir::new("cw-invalid");
    let path = dir.file("config.yaml", &format!("{HEADER}mode: iptables\n"));
    let mut w = watch_with(&path, |text| {
        if !text.contains("kind: ") {
            Err("Object 'Kind' is missing".into())
        } else if text.contains("bogus") {
            Err("oomScoreAdj: invalid type: string \"bogus\", expected i32".into())
        } else {
            Ok(())
        }
    });
    write(&path, "");
    assert_quiet(&mut w, "truncated (half-written)").await;
    write(&path, &format!("{HEADER}oomScoreAdj: bogus\n"));
    assert_quiet(&mut w, "invalid").await;
    write(&path, &format!("{HEADER}mode: ipvs\n"));
    assert_fires(&mut w, "fixed").await;
}

#[tokio::test]
async fn a_change_before_the_first_poll_is_not_lost() {
    let dir = TempDir::new("cw-early");
    let path = dir.file("config.yaml", &format!("{HEADER}mode: ipvs\n"));
    // the options were loaded from other bytes than the file now holds
    let mut w = ConfigWatch::new(
        vec![(
            path.clone(),
            format!("{HEADER}mode: iptables\n").into_bytes(),
        )],
        || Ok(()),
    )
    .unwrap();
    assert_fires(&mut w, "changed between load and watch").await;

    // and an event between new() and the first poll is kept in the queue
    let path = dir.file("config2.yaml", &format!("{HEADER}mode: ipvs\n"));
    let mut w = watch_one(&path);
    write(&path, &format!("{HEADER}mode: nftables\n"));
    assert_fires(&mut w, "event queued before the first poll").await;
}

#[tokio::test]
async fn without_config_files_nothing_is_watched() {
    let o = opts(&[]);
    assert!(o.loaded_files.is_empty());
    let mut w = ConfigWatch::for_options(&o).unwrap();
    assert!(w.paths().is_empty());
    assert_quiet(&mut w, "no --config").await;
    let watch = file_watch::watch(&o);
    assert!(
        tokio::time::timeout(QUIET, watch).await.is_err(),
        "watch() never resolves without files"
    );
}

#[test]
fn a_missing_file_fails_at_set_up() {
    let e = ConfigWatch::new(
        vec![(PathBuf::from("/nonexistent/kube-proxy.yaml"), Vec::new())],
        || Ok(()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("/nonexistent"), "{e}");
}

#[test]
fn resolution_entries_cover_every_symlink_hop() {
    let cm = ConfigMapVolume::new(&[("config.conf", "x")]);
    let vol = cm.dir.path().to_path_buf();
    let ts = cm.current_dir();
    let got = file_watch::resolution_entries(&cm.path("config.conf")).unwrap();
    let want = vec![
        (vol.clone(), "config.conf".into()),
        (vol.clone(), "..data".into()),
        (ts, "config.conf".into()),
    ];
    assert_eq!(got, want);
    let plain = cm.dir.file("plain.yaml", "x");
    assert_eq!(
        file_watch::resolution_entries(&plain).unwrap(),
        vec![(vol, "plain.yaml".into())]
    );
}
