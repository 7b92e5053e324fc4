//! Checking arguments, minting owners and reading the route's times.

use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// The longest lock name, in bytes of UTF-8.
pub const MAX_NAME_BYTES: usize = 256;
/// The longest owner, in bytes.
pub const MAX_OWNER_BYTES: usize = 256;
/// The longest lifetime the route takes: one year.
pub const MAX_TTL_SECONDS: u64 = 31_536_000;
/// The most permits one semaphore may have.
pub const MAX_LIMIT: u32 = 1024;

/// Checks a lock name: 1 to 256 bytes, no control character, no '#'.
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Invalid("lock name: must not be empty".into()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::Invalid(format!(
            "lock name: must be at most {} bytes, got {}",
            MAX_NAME_BYTES,
            name.len()
        )));
    }
    for (i, c) in name.chars().enumerate() {
        if c == '#' {
            return Err(Error::Invalid(format!(
                "lock name {:?}: must not contain '#' (character {})",
                name, i
            )));
        }
        if c.is_control() {
            return Err(Error::Invalid(format!(
                "lock name {:?}: must not contain a control character (U+{:04X} at character {})",
                name, c as u32, i
            )));
        }
    }
    Ok(())
}

/// Checks an owner: 1 to 256 bytes.
pub(crate) fn validate_owner(owner: &str) -> Result<()> {
    if owner.is_empty() || owner.len() > MAX_OWNER_BYTES {
        return Err(Error::Invalid(format!(
            "owner must be 1 to {} bytes, got {} ({:?})",
            MAX_OWNER_BYTES,
            owner.len(),
            owner
        )));
    }
    Ok(())
}

/// Checks a lifetime and answers it in whole seconds for the route, rounded
/// up: the server's lifetime is then never shorter than the one the handle
/// counts.
pub(crate) fn ttl_seconds(ttl: Duration) -> Result<u64> {
    if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(MAX_TTL_SECONDS) {
        return Err(Error::Invalid(format!(
            "ttl must be from 1s to {}s (a year), got {:?}",
            MAX_TTL_SECONDS, ttl
        )));
    }
    Ok(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
}

/// Checks a semaphore's size.
pub(crate) fn validate_limit(n: u32) -> Result<()> {
    if !(1..=MAX_LIMIT).contains(&n) {
        return Err(Error::Invalid(format!(
            "semaphore size n must be from 1 to {}, got {}",
            MAX_LIMIT, n
        )));
    }
    Ok(())
}

/// An owner unique to this process and call: `host:pid:random`.
pub fn mint_owner() -> String {
    format!("{}:{}:{:08x}", hostname(), std::process::id(), random_u64() as u32)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its whole length, which is passed.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let host = String::from_utf8_lossy(&buf[..end]).into_owned();
    if host.is_empty() {
        "unknown".into()
    } else {
        host
    }
}

/// Random bits from the kernel; when it cannot be read, the clock and the
/// address of a local, which still differ between calls and processes.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (&b as *const _ as u64).rotate_left(32)
}

/// Spreads waiters out, so they do not all ask at once: a random time
/// between half and one and a half times poll, at most left.
pub(crate) fn jitter(poll: Duration, left: Duration) -> Duration {
    let frac = (random_u64() % 1000) as f64 / 1000.0;
    std::cmp::min(poll.mul_f64(0.5 + frac), left)
}

/// Reads one of the route's times (RFC 3339, UTC, like
/// `2026-12-02T10:00:50.000000Z`). None for anything else.
pub(crate) fn parse_time(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse::<i64>().ok() };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut nanos: u32 = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<9}", &frac[..digits.min(9)]);
        nanos = padded.parse().ok()?;
        rest = &frac[digits..];
    }
    if rest != "Z" || !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec;
    Some(UNIX_EPOCH + Duration::new(u64::try_from(secs).ok()?, nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name("daily-report").is_ok());
        assert!(validate_name(&"é".repeat(128)).is_ok());
        for (bad, says) in [
            ("", "empty"),
            ("a#b", "'#'"),
            ("a\nb", "control character (U+000A"),
            (&"x".repeat(257) as &str, "at most 256 bytes, got 257"),
            (&"é".repeat(129) as &str, "got 258"),
        ] {
            let e = validate_name(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{:?}: {}", bad, e);
        }
    }

    #[test]
    fn ttls_are_checked_and_rounded_up() {
        assert_eq!(ttl_seconds(Duration::from_secs(30)).unwrap(), 30);
        assert_eq!(ttl_seconds(Duration::from_millis(1500)).unwrap(), 2);
        assert_eq!(
            ttl_seconds(Duration::from_secs(MAX_TTL_SECONDS)).unwrap(),
            MAX_TTL_SECONDS
        );
        for bad in [
            Duration::ZERO,
            Duration::from_millis(999),
            Duration::from_secs(MAX_TTL_SECONDS + 1),
        ] {
            assert!(ttl_seconds(bad)
                .unwrap_err()
                .to_string()
                .starts_with("ttl must be from 1s"));
        }
    }

    #[test]
    fn limits_and_owners_are_checked() {
        assert!(validate_limit(1).is_ok() && validate_limit(1024).is_ok());
        assert!(validate_limit(0).unwrap_err().to_string().contains("got 0"));
        assert!(validate_limit(1025).unwrap_err().to_string().contains("got 1025"));
        assert!(validate_owner("").is_err());
        assert!(validate_owner(&"o".repeat(257)).is_err());
    }

    #[test]
    fn owners_are_host_pid_random_and_differ() {
        let (a, b) = (mint_owner(), mint_owner());
        assert_ne!(a, b);
        let parts: Vec<&str> = a.rsplitn(3, ':').collect();
        assert_eq!(parts.len(), 3, "{}", a);
        assert_eq!(parts[1], std::process::id().to_string());
        assert_eq!(parts[0].len(), 8);
        assert!(validate_owner(&a).is_ok());
    }

    #[test]
    fn route_times_are_read() {
        let t = parse_time("2026-12-02T10:00:50.250000Z").unwrap();
        let d = t.duration_since(UNIX_EPOCH).unwrap();
        // date -u -d 2026-12-02T10:00:50Z +%s
        assert_eq!(d.as_secs(), 1_796_205_650);
        assert_eq!(d.subsec_millis(), 250);
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(UNIX_EPOCH));
        for bad in [
            "",
            "2026-12-02 10:00:50Z",
            "2026-12-02T10:00:50",
            "2026-13-02T10:00:50Z",
            "2026-12-02T10:00:50.Z",
        ] {
            assert_eq!(parse_time(bad), None, "{:?}", bad);
        }
    }
}
