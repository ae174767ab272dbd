//! Which network interfaces face pods, read from /sys/class/net of the
//! agent's network namespace.

use std::{collections::BTreeMap, fs, io};

/// Interface name -> ifindex of every interface whose name starts with one of `prefixes`.
pub fn matching(prefixes: &[String]) -> io::Result<BTreeMap<String, u32>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir("/sys/class/net")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !prefixes.iter().any(|p| name.starts_with(p.as_str())) {
            continue;
        }
        // The interface may vanish between listing and reading: skip it then.
        let Ok(index) = fs::read_to_string(format!("/sys/class/net/{name}/ifindex")) else {
            continue;
        };
        if let Ok(index) = index.trim().parse() {
            out.insert(name, index);
        }
    }
    Ok(out)
}
