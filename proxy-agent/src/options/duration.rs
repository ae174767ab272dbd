//! Go `time.Duration` / `metav1.Duration` semantics: the exact text format kube-proxy
//! accepts on its flags and in its config file (`30s`, `1h0m0s`, `250ms`, `-1s`, `0`),
//! and the exact text it writes back (`Duration.String()`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A signed duration in nanoseconds, as Go's `time.Duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration(pub i64);

/// Why a duration string was rejected; the text mirrors Go's `time.ParseDuration`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    #[error("time: missing unit in duration {0:?}")]
    MissingUnit(String),
    #[error("time: unknown unit {unit:?} in duration {input:?}")]
    UnknownUnit { unit: String, input: String },
}

const NS: i64 = 1;
const US: i64 = 1_000;
const MS: i64 = 1_000_000;
const SEC: i64 = 1_000_000_000;
const MIN: i64 = 60 * SEC;
const HOUR: i64 = 60 * MIN;

impl GoDuration {
    pub const ZERO: GoDuration = GoDuration(0);

    pub const fn from_secs(s: i64) -> Self {
        GoDuration(s * SEC)
    }
    pub const fn from_millis(ms: i64) -> Self {
        GoDuration(ms * MS)
    }
    pub const fn nanos(self) -> i64 {
        self.0
    }
    /// Whole seconds, truncated toward zero (what the conntrack sysctls take).
    pub const fn as_secs(self) -> i64 {
        self.0 / SEC
    }
    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }
    /// The std duration, or `None` when negative.
    pub fn to_std(self) -> Option<Duration> {
        u64::try_from(self.0).ok().map(Duration::from_nanos)
    }

    /// Parses like Go's `time.ParseDuration`.
    pub fn parse(input: &str) -> Result<Self, DurationError> {
        let invalid = || DurationError::Invalid(input.to_string());
        let mut s = input;
        let mut neg = false;
        if let Some(rest) = s.strip_prefix('-') {
            neg = true;
            s = rest;
        } else if let Some(rest) = s.strip_prefix('+') {
            s = rest;
        }
        if s == "0" {
            return Ok(GoDuration(0));
        }
        if s.is_empty() {
            return Err(invalid());
        }
        let mut total: i128 = 0;
        while !s.is_empty() {
            // integer part
            let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
            let int_part = &s[..int_len];
            s = &s[int_len..];
            let mut frac_part = "";
            if let Some(rest) = s.strip_prefix('.') {
                let frac_len = rest.bytes().take_while(u8::is_ascii_digit).count();
                frac_part = &rest[..frac_len];
                s = &rest[frac_len..];
            }
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(invalid());
            }
            let unit_len = s
                .char_indices()
                .find(|(_, c)| *c == '.' || c.is_ascii_digit())
                .map(|(i, _)| i)
                .unwrap_or(s.len());
            if unit_len == 0 {
                return Err(DurationError::MissingUnit(input.to_string()));
            }
            let unit = &s[..unit_len];
            s = &s[unit_len..];
            let scale: i64 = match unit {
                "ns" => NS,
                "us" | "\u{b5}s" | "\u{3bc}s" => US,
                "ms" => MS,
                "s" => SEC,
                "m" => MIN,
                "h" => HOUR,
                _ => {
                    return Err(DurationError::UnknownUnit {
                        unit: unit.to_string(),
                        input: input.to_string(),
                    });
                }
            };
            let int_val: i128 = if int_part.is_empty() {
                0
            } else {
                int_part.parse::<i128>().map_err(|_| invalid())?
            };
            let mut v = int_val.checked_mul(scale as i128).ok_or_else(invalid)?;
            if !frac_part.is_empty() {
                // exact fraction: digits * scale / 10^len, truncated like Go
                let digits = &frac_part[..frac_part.len().min(30)];
                let f: i128 = digits.parse().map_err(|_| invalid())?;
                let denom = 10i128.pow(digits.len() as u32);
                v += f * scale as i128 / denom;
            }
            total = total.checked_add(v).ok_or_else(invalid)?;
            if total > i64::MAX as i128 + i128::from(neg) {
                return Err(invalid());
            }
        }
        let total = if neg { -total } else { total };
        i64::try_from(total).map(GoDuration).map_err(|_| invalid())
    }
}

impl FromStr for GoDuration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GoDuration::parse(s)
    }
}

/// Writes the fraction of `v` with `prec` digits, trailing zeros dropped; returns `v / 10^prec`.
fn frac(out: &mut String, v: u64, prec: u32) -> u64 {
    let p = 10u64.pow(prec);
    let f = v % p;
    if f != 0 {
        let digits = format!("{:0width$}", f, width = prec as usize);
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    v / p
}

impl fmt::Display for GoDuration {
    /// Same text as Go's `Duration.String()`: `0s`, `250ms`, `1.5s`, `1m30s`, `24h0m0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let neg = self.0 < 0;
        let u = self.0.unsigned_abs();
        let mut out = String::new();
        if u == 0 {
            return f.write_str("0s");
        }
        if u < SEC as u64 {
            let (prec, unit) = if u < US as u64 {
                (0, "ns")
            } else if u < MS as u64 {
                (3, "\u{b5}s")
            } else {
                (6, "ms")
            };
            let mut fr = String::new();
            let whole = frac(&mut fr, u, prec);
            out = format!("{whole}{fr}{unit}");
        } else {
            let mut fr = String::new();
            let secs = frac(&mut fr, u, 9);
            let s = secs % 60;
            let mins = secs / 60;
            out.insert_str(0, &format!("{s}{fr}s"));
            if mins > 0 {
                out.insert_str(0, &format!("{}m", mins % 60));
                let hours = mins / 60;
                if hours > 0 {
                    out.insert_str(0, &format!("{hours}h"));
                }
            }
        }
        if neg {
            out.insert(0, '-');
        }
        f.write_str(&out)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    /// `metav1.Duration` only accepts a string.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = GoDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string such as \"30s\" or \"1h0m0s\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<GoDuration, E> {
                GoDuration::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// `TimeOrMetaDuration` (logging.flushFrequency): a duration string or integer nanoseconds.
pub mod time_or_meta {
    use super::GoDuration;
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(i64),
        Str(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<GoDuration, D::Error> {
        match Option::<Raw>::deserialize(d)? {
            None => Ok(GoDuration::ZERO),
            Some(Raw::Int(n)) => Ok(GoDuration(n)),
            Some(Raw::Str(s)) => GoDuration::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_go() {
        let cases = [
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5\u{b5}s"),
            (250 * MS, "250ms"),
            (SEC, "1s"),
            (1_500 * MS, "1.5s"),
            (30 * SEC, "30s"),
            (90 * SEC, "1m30s"),
            (15 * MIN, "15m0s"),
            (HOUR, "1h0m0s"),
            (24 * HOUR, "24h0m0s"),
            (-SEC, "-1s"),
            (HOUR + 500 * MS, "1h0m0.5s"),
        ];
        for (ns, text) in cases {
            assert_eq!(GoDuration(ns).to_string(), text, "{ns}");
            assert_eq!(GoDuration::parse(text).unwrap(), GoDuration(ns), "{text}");
        }
    }

    #[test]
    fn parses_like_go() {
        assert_eq!(GoDuration::parse("0").unwrap(), GoDuration(0));
        assert_eq!(GoDuration::parse("-0").unwrap(), GoDuration(0));
        assert_eq!(
            GoDuration::parse("2h22m").unwrap(),
            GoDuration(2 * HOUR + 22 * MIN)
        );
        assert_eq!(GoDuration::parse("1.5h").unwrap(), GoDuration(90 * MIN));
        assert_eq!(GoDuration::parse(".5s").unwrap(), GoDuration(500 * MS));
        assert_eq!(GoDuration::parse("10us").unwrap(), GoDuration(10 * US));
        assert_eq!(GoDuration::parse("+5s").unwrap(), GoDuration(5 * SEC));
        assert_eq!(
            GoDuration::parse("1").unwrap_err(),
            DurationError::MissingUnit("1".into())
        );
        assert_eq!(
            GoDuration::parse("").unwrap_err(),
            DurationError::Invalid("".into())
        );
        assert_eq!(
            GoDuration::parse("abc").unwrap_err(),
            DurationError::Invalid("abc".into())
        );
        assert_eq!(
            GoDuration::parse(".s").unwrap_err(),
            DurationError::Invalid(".s".into())
        );
        assert!(matches!(
            GoDuration::parse("5d").unwrap_err(),
            DurationError::UnknownUnit { ref unit, .. } if unit == "d"
        ));
        assert!(GoDuration::parse("9999999999h").is_err());
        assert_eq!(
            GoDuration::parse("time: invalid").unwrap_err().to_string(),
            "time: invalid duration \"time: invalid\""
        );
    }
}
