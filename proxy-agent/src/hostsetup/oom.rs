//! `oomScoreAdj`, written to `/proc/self/oom_score_adj` (a failure is logged, not fatal).

use std::path::Path;

pub const SELF_OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";

/// Writes `value` to `path` (normally [`SELF_OOM_SCORE_ADJ`]).
pub fn apply(value: i32, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, value.to_string())
}
