//! Kubernetes `resource.Quantity` text (`512`, `1K`, `2Ki`, `3M`, `5Mi`, `1e3`), as taken by
//! `--log-text-info-buffer-size` and `logging.options.*.infoBufferSize`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A quantity as written, with its value in base units (bytes here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    text: String,
    value: i128,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}"
)]
pub struct QuantityError(pub String);

impl Default for Quantity {
    fn default() -> Self {
        Quantity {
            text: "0".into(),
            value: 0,
        }
    }
}

impl Quantity {
    pub fn value(&self) -> i128 {
        self.value
    }
    pub fn is_zero(&self) -> bool {
        self.value == 0
    }

    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let err = || QuantityError(input.to_string());
        let s = input.trim();
        if s.is_empty() {
            return Err(err());
        }
        let (sign, body) = match s.as_bytes()[0] {
            b'-' => (-1i128, &s[1..]),
            b'+' => (1, &s[1..]),
            _ => (1, s),
        };
        let num_len = body
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (num, suffix) = body.split_at(num_len);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(err());
        }
        let (int_s, frac_s) = num.split_once('.').unwrap_or((num, ""));
        let mantissa: i128 = format!("{int_s}{frac_s}").parse().map_err(|_| err())?;
        let frac_digits = frac_s.len() as u32;
        // (multiplier numerator, base-10 exponent)
        let (mult, exp10): (i128, i32) = match suffix {
            "" => (1, 0),
            "Ki" => (1 << 10, 0),
            "Mi" => (1 << 20, 0),
            "Gi" => (1 << 30, 0),
            "Ti" => (1 << 40, 0),
            "Pi" => (1 << 50, 0),
            "Ei" => (1 << 60, 0),
            "n" => (1, -9),
            "u" => (1, -6),
            "m" => (1, -3),
            "k" => (1, 3),
            "M" => (1, 6),
            "G" => (1, 9),
            "T" => (1, 12),
            "P" => (1, 15),
            "E" => (1, 18),
            other => {
                let rest = other.strip_prefix(['e', 'E']).ok_or_else(err)?;
                let e: i32 = rest.parse().map_err(|_| err())?;
                if !(-30..=30).contains(&e) {
                    return Err(err());
                }
                (1, e)
            }
        };
        let exp = exp10 - frac_digits as i32;
        let mut value = mantissa.checked_mul(mult).ok_or_else(err)?;
        if exp >= 0 {
            value = value.checked_mul(10i128.pow(exp as u32)).ok_or_else(err)?;
        } else {
            // round up like Quantity.Value()
            let d = 10i128.pow((-exp) as u32);
            value = (value + d - 1) / d;
        }
        Ok(Quantity {
            text: s.to_string(),
            value: sign * value,
        })
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Str(String),
        }
        match Option::<Raw>::deserialize(d)? {
            None => Ok(Quantity::default()),
            Some(Raw::Int(n)) => Ok(Quantity {
                text: n.to_string(),
                value: n as i128,
            }),
            Some(Raw::Str(s)) => Quantity::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        for (text, v) in [
            ("0", 0),
            ("512", 512),
            ("1K", -1),
            ("1k", 1000),
            ("2Ki", 2048),
            ("3M", 3_000_000),
            ("5Mi", 5 << 20),
            ("6Gi", 6 << 30),
            ("1e3", 1000),
            ("1.5k", 1500),
            ("100m", 1),
        ] {
            match Quantity::parse(text) {
                Ok(q) => assert_eq!(q.value(), v, "{text}"),
                Err(_) => assert_eq!(v, -1, "{text} should parse"),
            }
        }
        for bad in ["", "abc", "1KB", "1.2.3", "Ki", "--1"] {
            assert!(Quantity::parse(bad).is_err(), "{bad}");
        }
    }
}
