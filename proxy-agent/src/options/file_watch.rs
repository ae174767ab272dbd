//! Exit when a configuration file changes (config_rules.md §3, "Config file change"), so that
//! the supervisor restarts the agent with the new content.
//!
//! Upstream kube-proxy puts an fsnotify watch on the `--config` file's inode and exits with
//! `content of the proxy server's configuration file was updated` on a Write or Rename event.
//! A Kubernetes ConfigMap volume never produces either: kubelet writes a new timestamped
//! directory and renames a `..data` symlink over the old one, so the watched inode is only
//! unlinked (upstream then never restarts). Here every directory entry the path resolves
//! through is watched as well: the path's own entry, each symlink met on the way (`config.conf`
//! -> `..data/config.conf`, `..data` -> `..2024_05_01_...`) and the final file's entry. Any
//! event on one of them makes us re-read the path, and the decision is made on content:
//!
//! * the bytes at the path differ from the bytes loaded at start-up, and
//! * the whole command line would load again with the new content (`accept`),
//!
//! then [`ConfigWatch::changed`] resolves with [`ConfigFileChanged`]. Two deliberate differences
//! from upstream follow: an event that leaves the content unchanged (a `touch`, a ConfigMap
//! update that only changed another key, an atomic replace with the same bytes) does not
//! restart, and content that would not load (a half-written file, a syntax or type error) is
//! logged and the running configuration stays in effect instead of the agent exiting into a
//! crash loop with its datapath detached. Removing the file is ignored, as upstream does.
//!
//! The inotify descriptor and its watches are created synchronously in [`ConfigWatch::new`], so
//! nothing that happens after that is missed, and the first call of `changed` also compares
//! the current content with the loaded one, so nothing since start-up is missed either.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::options::{self, ProxyOptions};

/// The error the agent exits with; its text is upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("content of the proxy server's configuration file was updated")]
pub struct ConfigFileChanged {
    /// The file (as given on the command line) whose content changed.
    pub path: PathBuf,
}

/// Decides whether new content would be accepted at a restart; `Err` carries the reason.
pub type AcceptFn = dyn Fn() -> Result<(), String> + Send + Sync;

/// Events on directories: an entry named like one we resolve through appeared, was replaced,
/// renamed away, written or removed.
const DIR_MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_MODIFY
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE
    | libc::IN_ONLYDIR;
/// Events on the file itself (upstream's Write and Rename).
const FILE_MASK: u32 = libc::IN_MODIFY | libc::IN_CLOSE_WRITE | libc::IN_MOVE_SELF;
/// Bound on symlinks followed while resolving a path (the kernel's ELOOP limit).
const MAX_SYMLINKS: usize = 40;

/// One watched configuration file.
#[derive(Debug)]
struct Watched {
    path: PathBuf,
    /// The content the running configuration was built from.
    loaded: Vec<u8>,
    /// Content already found changed but rejected by `accept` (not reported twice).
    rejected: Option<Vec<u8>>,
}

/// Watches configuration files; see the module documentation.
pub struct ConfigWatch {
    inner: Option<Inner>,
}

struct Inner {
    /// The inotify descriptor until the first `changed` call registers it with the reactor.
    fd: Option<OwnedFd>,
    afd: Option<AsyncFd<OwnedFd>>,
    files: Vec<Watched>,
    /// Directory watch -> entry names that matter in it.
    dir_names: HashMap<i32, HashSet<OsString>>,
    /// Watches on the files themselves (through symlinks).
    file_wds: HashSet<i32>,
    accept: Arc<AcceptFn>,
    /// Compare contents at the next `changed` call without waiting for an event.
    check_now: bool,
}

impl std::fmt::Debug for ConfigWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            None => f.write_str("ConfigWatch(disabled)"),
            Some(i) => f
                .debug_struct("ConfigWatch")
                .field(
                    "files",
                    &i.files.iter().map(|w| &w.path).collect::<Vec<_>>(),
                )
                .field("dir_watches", &i.dir_names)
                .field("file_watches", &i.file_wds)
                .finish(),
        }
    }
}

impl ConfigWatch {
    /// A watch over nothing: [`changed`](Self::changed) never resolves.
    pub fn disabled() -> Self {
        ConfigWatch { inner: None }
    }

    /// Watches the files the options were loaded from (`--config` and `--ebpf-config`, with
    /// the bytes read at start-up). A change is accepted when the original command line would
    /// get through start-up again (parse, validate, mode support, fatal checks). Without
    /// config files, [`changed`](Self::changed) never resolves.
    pub fn for_options(opts: &ProxyOptions) -> io::Result<Self> {
        let args = opts.args.clone();
        let files = opts
            .loaded_files
            .iter()
            .map(|f| (f.path.clone(), f.contents.clone().into_bytes()))
            .collect();
        Self::new(files, move || restart_would_start(&args))
    }

    /// Watches `files` (path, content loaded at start-up). `accept` runs (on a blocking
    /// thread) when a file's content changed and says whether the agent would start with it.
    /// Fails when a file or its directory cannot be watched (upstream fails start-up then too).
    /// Needs no async runtime; the descriptor joins the reactor on the first `changed` call.
    pub fn new(
        files: Vec<(PathBuf, Vec<u8>)>,
        accept: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> io::Result<Self> {
        if files.is_empty() {
            return Ok(Self::disabled());
        }
        // SAFETY: plain syscall; the result is checked.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut inner = Inner {
            fd: Some(fd),
            afd: None,
            files: files
                .into_iter()
                .map(|(path, loaded)| Watched {
                    path,
                    loaded,
                    rejected: None,
                })
                .collect(),
            dir_names: HashMap::new(),
            file_wds: HashSet::new(),
            accept: Arc::new(accept),
            check_now: true,
        };
        inner.arm(true)?;
        Ok(ConfigWatch { inner: Some(inner) })
    }

    /// The files watched.
    pub fn paths(&self) -> Vec<&Path> {
        self.inner
            .as_ref()
            .map(|i| i.files.iter().map(|w| w.path.as_path()).collect())
            .unwrap_or_default()
    }

    /// Resolves once a watched file's content changed to something the agent would start
    /// with: the error is a [`ConfigFileChanged`]. An inotify failure (e.g. the event queue
    /// overflowed and could not be read) resolves with that error instead. Never resolves for
    /// [`disabled`](Self::disabled). Cancel-safe: dropping the future loses no event.
    pub async fn changed(&mut self) -> anyhow::Error {
        match &mut self.inner {
            None => std::future::pending().await,
            Some(inner) => match inner.run().await {
                Ok(changed) => {
                    tracing::warn!(
                        path = %changed.path.display(),
                        "configuration file changed; exiting so that the supervisor restarts with the new content"
                    );
                    anyhow::Error::new(changed)
                }
                Err(e) => anyhow::Error::new(e).context("watching the configuration file"),
            },
        }
    }
}

/// Whether a restart with `args` gets past start-up's checks: options (file syntax, fields,
/// validation), the mode's support on this node, and the fatal §3.3 checks.
fn restart_would_start(args: &[std::ffi::OsString]) -> Result<(), String> {
    let o = match options::parse(args.to_vec(), &options::Environment::default()) {
        Ok(options::Parsed::Run(o)) => o,
        Ok(_) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    o.check_mode_supported(&crate::modes::HostSupport)
        .map_err(|e| e.to_string())?;
    let facts = options::checks::NodeFacts::at_startup(o.mode);
    match options::checks::run(&o.config, &facts).fatal {
        Some(e) => Err(e.to_string()),
        None => Ok(()),
    }
}

/// Convenience for `select!`: watches the option's files and resolves like
/// [`ConfigWatch::changed`]; a watch that cannot be set up resolves with that error at once.
pub async fn watch(opts: &ProxyOptions) -> anyhow::Error {
    match ConfigWatch::for_options(opts) {
        Ok(mut w) => w.changed().await,
        Err(e) => anyhow::Error::new(e).context("watching the configuration file"),
    }
}

impl Inner {
    async fn run(&mut self) -> io::Result<ConfigFileChanged> {
        loop {
            if self.check_now {
                self.arm(false)?;
                let changed = self.compare().await;
                // Cleared only once the comparison finished, so a cancelled call redoes it.
                self.check_now = false;
                if let Some(changed) = changed {
                    return Ok(changed);
                }
            }
            if self.afd.is_none()
                && let Some(fd) = self.fd.take()
            {
                // SAFETY: an OwnedFd is open and always returns the same descriptor; the
                // AsyncFd owns it from here on.
                match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
                    Ok(afd) => self.afd = Some(afd),
                    Err(e) => {
                        let (fd, err) = e.into_parts();
                        self.fd = Some(fd);
                        return Err(err);
                    }
                }
            }
            let events = {
                let afd = self.afd.as_ref().expect("registered above");
                let mut guard = afd.readable().await?;
                let mut buf = EventBuf([0; 8192]);
                match guard.try_io(|fd| read_fd(fd.get_ref(), &mut buf.0)) {
                    Ok(Ok(n)) => parse_events(&buf.0[..n]),
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => continue,
                }
            };
            for ev in &events {
                if self.relevant(ev) {
                    self.check_now = true;
                }
            }
        }
    }

    /// Whether the event can have changed what the watched paths hold; also forgets watches
    /// the kernel dropped.
    fn relevant(&mut self, ev: &Event) -> bool {
        if ev.mask & libc::IN_Q_OVERFLOW != 0 {
            return true; // events were lost: look
        }
        if ev.mask & libc::IN_IGNORED != 0 {
            self.dir_names.remove(&ev.wd);
            self.file_wds.remove(&ev.wd);
            return false;
        }
        if self.file_wds.contains(&ev.wd) && ev.mask & FILE_MASK != 0 {
            return true;
        }
        match (self.dir_names.get(&ev.wd), &ev.name) {
            (Some(names), Some(name)) => names.contains(name.as_os_str()),
            _ => false,
        }
    }

    /// (Re)creates the watches for what each path resolves to now. ConfigMap updates move the
    /// path to new inodes, so this runs before every content check. Errors are fatal only on
    /// the first call (start-up); later a path may be missing for a moment during a swap.
    fn arm(&mut self, strict: bool) -> io::Result<()> {
        let raw = match (&self.fd, &self.afd) {
            (Some(fd), _) => fd.as_raw_fd(),
            (None, Some(afd)) => afd.get_ref().as_raw_fd(),
            (None, None) => unreachable!("the descriptor lives as long as the watch"),
        };
        for w in &self.files {
            let entries = match resolution_entries(&w.path) {
                Ok(e) => e,
                Err(e) if strict => return Err(with_path(e, &w.path)),
                Err(_) => continue,
            };
            for (dir, name) in entries {
                match add_watch(raw, &dir, DIR_MASK) {
                    Ok(wd) => {
                        self.dir_names.entry(wd).or_default().insert(name);
                    }
                    Err(e) if strict => return Err(with_path(e, &dir)),
                    Err(_) => {}
                }
            }
            match add_watch(raw, &w.path, FILE_MASK) {
                Ok(wd) => {
                    self.file_wds.insert(wd);
                }
                Err(e) if strict => return Err(with_path(e, &w.path)),
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Reads every path; returns the first whose new content `accept` takes.
    async fn compare(&mut self) -> Option<ConfigFileChanged> {
        let mut changed = Vec::new();
        for (i, w) in self.files.iter().enumerate() {
            // A missing or unreadable file is not a change (upstream ignores removals).
            let Ok(now) = std::fs::read(&w.path) else {
                continue;
            };
            if now != w.loaded && w.rejected.as_ref() != Some(&now) {
                changed.push((i, now));
            }
        }
        if changed.is_empty() {
            return None;
        }
        let accept = Arc::clone(&self.accept);
        let verdict = tokio::task::spawn_blocking(move || accept())
            .await
            .unwrap_or_else(|e| Err(format!("checking the new configuration panicked: {e}")));
        match verdict {
            Ok(()) => {
                let (i, _) = &changed[0];
                Some(ConfigFileChanged {
                    path: self.files[*i].path.clone(),
                })
            }
            Err(reason) => {
                for (i, now) in changed {
                    let w = &mut self.files[i];
                    tracing::error!(
                        path = %w.path.display(),
                        error = %reason,
                        "configuration file changed but the new content would not load; keeping the running configuration"
                    );
                    w.rejected = Some(now);
                }
                None
            }
        }
    }
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn add_watch(fd: i32, path: &Path, mask: u32) -> io::Result<i32> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `c` is a valid NUL-terminated string; the result is checked.
    let wd = unsafe { libc::inotify_add_watch(fd, c.as_ptr(), mask) };
    if wd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(wd)
    }
}

fn read_fd(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A read buffer aligned for `struct inotify_event`.
#[repr(C, align(8))]
struct EventBuf([u8; 8192]);

#[derive(Debug)]
struct Event {
    wd: i32,
    mask: u32,
    name: Option<OsString>,
}

/// Splits a read of the inotify descriptor into events.
fn parse_events(mut buf: &[u8]) -> Vec<Event> {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let mut out = Vec::new();
    while buf.len() >= HEADER {
        // SAFETY: at least HEADER bytes remain; read_unaligned copes with any alignment.
        let ev: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
        let len = ev.len as usize;
        let Some(raw_name) = buf.get(HEADER..HEADER + len) else {
            break;
        };
        let name = raw_name.split(|b| *b == 0).next().unwrap_or_default();
        out.push(Event {
            wd: ev.wd,
            mask: ev.mask,
            name: (!name.is_empty()).then(|| OsStr::from_bytes(name).to_owned()),
        });
        buf = &buf[HEADER + len..];
    }
    out
}

/// Every (directory, entry name) whose replacement changes what `path` resolves to: each
/// symlink met while resolving it (the path itself, `..data` of a ConfigMap volume, ...) and
/// the final file's own entry.
pub fn resolution_entries(path: &Path) -> io::Result<Vec<(PathBuf, OsString)>> {
    let mut out = Vec::new();
    let mut todo = std::path::absolute(path)?;
    for _ in 0..=MAX_SYMLINKS {
        let comps: Vec<Component<'_>> = todo.components().collect();
        let mut cur = PathBuf::from("/");
        let mut redirected = None;
        for (i, c) in comps.iter().enumerate() {
            let name = match c {
                Component::Normal(n) => *n,
                // `cur` holds no symlink, so `..` is purely lexical here.
                Component::ParentDir => {
                    cur.pop();
                    continue;
                }
                _ => continue,
            };
            let next = cur.join(name);
            let is_link = std::fs::symlink_metadata(&next)
                .map(|m| m.file_type().is_symlink())
                .unwrap_or(false);
            if is_link {
                out.push((cur.clone(), name.to_owned()));
                let target = std::fs::read_link(&next)?;
                let mut p = if target.is_absolute() {
                    target
                } else {
                    cur.join(target)
                };
                for rest in &comps[i + 1..] {
                    p.push(rest.as_os_str());
                }
                redirected = Some(p);
                break;
            }
            cur = next;
        }
        match redirected {
            Some(p) => todo = p,
            None => {
                if let (Some(dir), Some(name)) = (cur.parent(), cur.file_name()) {
                    out.push((dir.to_path_buf(), name.to_owned()));
                }
                return Ok(out);
            }
        }
    }
    Err(io::Error::other(format!(
        "{}: too many levels of symbolic links",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_packed_events() {
        let mut buf = Vec::new();
        for (wd, mask, name) in [(1, libc::IN_MODIFY, ""), (2, libc::IN_MOVED_TO, "..data")] {
            let len = if name.is_empty() {
                0
            } else {
                (name.len() + 1).next_multiple_of(16)
            };
            let ev = libc::inotify_event {
                wd,
                mask,
                cookie: 0,
                len: len as u32,
            };
            // SAFETY: inotify_event is plain old data.
            let bytes: [u8; 16] = unsafe { std::mem::transmute(ev) };
            buf.extend_from_slice(&bytes);
            let mut n = name.as_bytes().to_vec();
            n.resize(len, 0);
            buf.extend_from_slice(&n);
        }
        let evs = parse_events(&buf);
        assert_eq!(evs.len(), 2);
        assert_eq!(
            (evs[0].wd, evs[0].mask, evs[0].name.is_none()),
            (1, libc::IN_MODIFY, true)
        );
        assert_eq!(evs[1].name.as_deref(), Some(OsStr::new("..data")));
        assert!(
            parse_events(&buf[..20]).len() == 1,
            "a truncated tail is dropped"
        );
    }
}
