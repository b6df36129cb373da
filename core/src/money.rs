//! Exact money arithmetic for prices and cost estimates.
//!
//! Prices are carried as integer micro-US-dollars so that configuration round-trips exactly
//! and finance reports never accumulate floating-point drift. Conversions to `f64` happen only
//! where a ranking needs a comparable number.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An amount of US dollars in millionths (1 USD = 1_000_000).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MicroUsd(pub u64);

/// Why a decimal dollar string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseMoneyError {
    /// The text is not `digits[.digits]`.
    #[error("`{0}` is not a non-negative decimal amount such as \"0.72\"")]
    NotDecimal(String),
    /// More than six decimal places cannot be represented in micro-dollars.
    #[error("`{0}` has more than 6 decimal places")]
    TooPrecise(String),
    /// The amount does not fit.
    #[error("`{0}` is too large")]
    Overflow(String),
}

impl MicroUsd {
    /// Zero dollars.
    pub const ZERO: MicroUsd = MicroUsd(0);

    /// The amount in dollars as a float, for ranking only.
    pub fn as_usd_f64(self) -> f64 {
        self.0 as f64 / 1_000_000.0
    }
}

impl FromStr for MicroUsd {
    type Err = ParseMoneyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (whole, frac) = match text.split_once('.') {
            Some((w, f)) => (w, f),
            None => (text, ""),
        };
        let digits_only = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits_only(whole) || !digits_only(frac) || (text.contains('.') && frac.is_empty()) {
            return Err(ParseMoneyError::NotDecimal(text.to_owned()));
        }
        if frac.len() > 6 {
            return Err(ParseMoneyError::TooPrecise(text.to_owned()));
        }
        let overflow = || ParseMoneyError::Overflow(text.to_owned());
        let whole: u64 = whole.parse().map_err(|_| overflow())?;
        let mut frac_micro: u64 = 0;
        for (i, b) in frac.bytes().enumerate() {
            frac_micro += u64::from(b - b'0') * 10u64.pow(5 - i as u32);
        }
        whole.checked_mul(1_000_000).and_then(|w| w.checked_add(frac_micro)).map(MicroUsd).ok_or_else(overflow)
    }
}

impl fmt::Display for MicroUsd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 1_000_000;
        let frac = self.0 % 1_000_000;
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let frac = format!("{frac:06}");
            write!(f, "{whole}.{}", frac.trim_end_matches('0'))
        }
    }
}

/// An exact amount of US dollars in 10⁻¹² (a per-million-token price in micro-dollars times
/// a token count is exactly this unit, so request costs never round).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PicoUsd(pub u128);

impl PicoUsd {
    /// What `tokens` cost at `price_per_million`.
    pub fn of_tokens(price_per_million: MicroUsd, tokens: u64) -> PicoUsd {
        PicoUsd(u128::from(price_per_million.0) * u128::from(tokens))
    }

    /// The sum, saturating at the largest amount.
    pub fn plus(self, other: PicoUsd) -> PicoUsd {
        PicoUsd(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for PicoUsd {
    /// Dollars as a decimal with no trailing zeros (`0.000123`), never rounded.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SCALE: u128 = 1_000_000_000_000;
        let whole = self.0 / SCALE;
        let frac = self.0 % SCALE;
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let frac = format!("{frac:012}");
            write!(f, "{whole}.{}", frac.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_exactly() {
        for (text, micro) in [("0", 0), ("0.72", 720_000), ("15", 15_000_000), ("0.000001", 1), ("3.5", 3_500_000)] {
            let parsed: MicroUsd = text.parse().expect("valid amount");
            assert_eq!(parsed, MicroUsd(micro), "{text}");
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn refuses_malformed_amounts() {
        for text in ["", "-1", "1.", ".5", "1.2.3", "abc", "1e3", "0.0000001"] {
            assert!(text.parse::<MicroUsd>().is_err(), "{text} should be refused");
        }
        assert!("99999999999999999999".parse::<MicroUsd>().is_err());
    }

    #[test]
    fn token_costs_are_exact() {
        // 1,234 tokens at $0.72 per million is $0.00088848 exactly.
        let cost = PicoUsd::of_tokens("0.72".parse().unwrap_or_default(), 1_234);
        assert_eq!(cost.to_string(), "0.00088848");
        // A single token at the smallest price is 10^-12 dollars, not zero.
        assert_eq!(PicoUsd::of_tokens(MicroUsd(1), 1).to_string(), "0.000000000001");
        assert_eq!(cost.plus(PicoUsd::of_tokens(MicroUsd(1_000_000), 1_000_000)).to_string(), "1.00088848");
    }
}
