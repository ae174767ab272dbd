//! Map names and capacities, used by both the programs and the agent.

pub const SERVICES: &str = "SERVICES";
pub const BACKENDS: &str = "BACKENDS";
pub const CONNTRACK: &str = "CONNTRACK";
pub const STATS: &str = "STATS";

/// Frontend slot 0 plus backend slots across all services.
pub const MAX_SERVICE_ENTRIES: u32 = 262_144;
pub const MAX_BACKENDS: u32 = 131_072;
pub const MAX_CONNTRACK: u32 = 262_144;
