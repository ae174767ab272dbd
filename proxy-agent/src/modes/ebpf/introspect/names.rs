//! What the maps' ids stand for. The maps hold only service and backend
//! ids; after every successful sync the agent publishes, in its state
//! directory, which service port and which endpoint each id is, for
//! `inspect` (and anything else) to name them.
//!
//! The file is replaced atomically (written beside, then renamed), so a
//! reader sees either the previous version or the new one, never a mix.

use std::{
    io::{self, Write as _},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// The file's name in the state directory.
pub const NAMES_FILE: &str = "datapath-names.json";
/// Raised when a field changes meaning or goes away (added fields do not).
pub const NAMES_FORMAT: u32 = 1;

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedNames {
    pub format: u32,
    /// The map ABI of the maps the ids belong to.
    pub abi: u32,
    pub node: String,
    /// The pin root of the maps the ids belong to.
    pub pin_root: String,
    /// When it was written, milliseconds since the Unix epoch.
    pub written_unix_ms: u64,
    pub services: Vec<PublishedService>,
    pub backends: Vec<PublishedBackend>,
}

/// One service port, by its service id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedService {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    /// The port's name; empty for an unnamed port.
    pub port_name: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// `Cluster` or `Local`.
    pub internal_traffic_policy: String,
    pub external_traffic_policy: String,
    /// `None` or `ClientIP`.
    pub session_affinity: String,
}

impl PublishedService {
    /// `namespace/name:port/PROTOCOL`, as upstream names a service port.
    pub fn port_name(&self) -> String {
        let mut s = format!("{}/{}", self.namespace, self.name);
        if !self.port_name.is_empty() {
            s.push(':');
            s.push_str(&self.port_name);
        }
        s.push('/');
        s.push_str(&self.protocol);
        s
    }
}

/// One endpoint, by its backend id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedBackend {
    pub id: u32,
    pub address: String,
    pub port: u16,
    pub protocol: String,
    /// The endpoint's node, when its EndpointSlice says.
    pub node: Option<String>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// On this node.
    pub local: bool,
}

/// Where the file of state directory `dir` is.
pub fn names_path(dir: &Path) -> PathBuf {
    dir.join(NAMES_FILE)
}

/// Replaces the file in `dir` (created if missing) with `names`.
pub fn write_names(dir: &Path, names: &PublishedNames) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = names_path(dir);
    let tmp = dir.join(format!(".{NAMES_FILE}.{}", std::process::id()));
    let result = (|| {
        // Buffered: serde_json writes token by token (a syscall each, some
        // hundreds of thousands at 50,000 services).
        let mut file = io::BufWriter::new(std::fs::File::create(&tmp)?);
        serde_json::to_writer(&mut file, names)?;
        file.write_all(b"\n")?;
        file.into_inner().map_err(|e| e.into_error())?.sync_data()?;
        std::fs::rename(&tmp, &path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The file of `dir`; `Ok(None)` when there is none.
pub fn read_names(dir: &Path) -> io::Result<Option<PublishedNames>> {
    let path = names_path(dir);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&text).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_replaced_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        assert_eq!(read_names(&state).unwrap(), None, "missing is not an error");
        let mut names = PublishedNames {
            format: NAMES_FORMAT,
            node: "node-a".into(),
            ..Default::default()
        };
        names.services.push(PublishedService {
            id: 3,
            namespace: "e2e".into(),
            name: "web".into(),
            port_name: "http".into(),
            protocol: "TCP".into(),
            ..Default::default()
        });
        write_names(&state, &names).unwrap();
        names.node = "node-b".into();
        write_names(&state, &names).unwrap();
        assert_eq!(read_names(&state).unwrap(), Some(names.clone()));
        let files: Vec<_> = std::fs::read_dir(&state).unwrap().collect();
        assert_eq!(files.len(), 1, "no temporary file left behind");
        assert_eq!(names.services[0].port_name(), "e2e/web:http/TCP");
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(names_path(dir.path()), "{").unwrap();
        let e = read_names(dir.path()).unwrap_err();
        assert!(e.to_string().contains(NAMES_FILE), "{e}");
    }
}
