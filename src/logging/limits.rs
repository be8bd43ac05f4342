//! The log settings as numbers: Calico's defaults, and the cap on the bytes
//! the log file and its backups may take together.
//!
//! Calico (`ConfigureLogging`) starts lumberjack with 100 MiB, 30 days and
//! 10 backups and overrides each with the config's value when it is not 0.
//! Here a value of 0 *or less* is the default too: lumberjack would read a
//! negative size as "rotate before every write" and a negative age or count
//! as "no limit", neither of which anyone means.
//!
//! The cap is `max_size × (max_count + 2)`, never more than [`CEILING`]
//! (1 GiB): room for the live file, `max_count` backups and, while a
//! rotation compresses a backup, its compressed copy. Backups are gzipped,
//! so the cap only bites when logs do not compress (or a process died
//! before compressing); then the oldest backups go first. So that the cap
//! always holds the live file and the backup being compressed, `max_size`
//! is at most a quarter of the ceiling ([`MAX_SIZE_CEILING`], 256 MiB),
//! where Calico would take any size. The cap can be passed by a few records
//! (the live file's, when several processes append at once) and, for as
//! long as it keeps it open, by a backup a process is compressing when
//! another prunes it.

use std::time::Duration;

use super::LogSettings;

const MIB: u64 = 1024 * 1024;
const DAY: u64 = 24 * 60 * 60;

/// Calico's default `log_file_max_size`, in MiB.
pub const DEFAULT_MAX_SIZE_MB: u64 = 100;
/// Calico's default `log_file_max_age`, in days.
pub const DEFAULT_MAX_AGE_DAYS: u64 = 30;
/// Calico's default `log_file_max_count`.
pub const DEFAULT_MAX_COUNT: usize = 10;
/// The most the log file and its backups ever take together.
pub const CEILING: u64 = 1024 * MIB;
/// The largest `max_size` honoured.
pub const MAX_SIZE_CEILING: u64 = CEILING / 4;

/// How big, how many and how old, in bytes, backups and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The live file never grows past this many bytes.
    pub max_size: u64,
    /// At most this many backups are kept (at least 1).
    pub max_count: usize,
    /// Backups whose name says they are older than this are removed.
    pub max_age: Duration,
    /// The live file (counted at `max_size`) plus the backups (counted
    /// twice while uncompressed) never take more bytes than this.
    pub cap: u64,
}

impl Limits {
    /// From the config, with Calico's defaults for 0 and below.
    pub fn from_settings(settings: &LogSettings) -> Limits {
        let or_default = |value: i64, default: u64| match u64::try_from(value) {
            Ok(v) if v > 0 => v,
            _ => default,
        };
        let max_count = or_default(settings.max_count, DEFAULT_MAX_COUNT as u64);
        Limits::new(
            or_default(settings.max_size_mb, DEFAULT_MAX_SIZE_MB).saturating_mul(MIB),
            usize::try_from(max_count).unwrap_or(usize::MAX),
            Duration::from_secs(
                or_default(settings.max_age_days, DEFAULT_MAX_AGE_DAYS).saturating_mul(DAY),
            ),
        )
    }

    /// `max_size` in bytes (clamped to 1..=[`MAX_SIZE_CEILING`]),
    /// `max_count` (at least 1), `max_age`; the cap follows from them.
    pub fn new(max_size: u64, max_count: usize, max_age: Duration) -> Limits {
        let max_size = max_size.clamp(1, MAX_SIZE_CEILING);
        let max_count = max_count.max(1);
        let slots = u64::try_from(max_count)
            .unwrap_or(u64::MAX)
            .saturating_add(2);
        Limits {
            max_size,
            max_count,
            max_age,
            cap: max_size.saturating_mul(slots).min(CEILING),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(size: i64, age: i64, count: i64) -> LogSettings {
        LogSettings {
            max_size_mb: size,
            max_age_days: age,
            max_count: count,
            ..LogSettings::default()
        }
    }

    #[test]
    fn zero_and_negative_mean_calicos_defaults() {
        let defaults = Limits::from_settings(&settings(100, 30, 10));
        assert_eq!(defaults.max_size, 100 * MIB);
        assert_eq!(defaults.max_age, Duration::from_secs(30 * DAY));
        assert_eq!(defaults.max_count, 10);
        assert_eq!(Limits::from_settings(&settings(0, 0, 0)), defaults);
        assert_eq!(Limits::from_settings(&settings(-1, -5, i64::MIN)), defaults);
        let each = Limits::from_settings(&settings(0, 7, -3));
        assert_eq!(each.max_size, 100 * MIB);
        assert_eq!(each.max_age, Duration::from_secs(7 * DAY));
        assert_eq!(each.max_count, 10);
    }

    #[test]
    fn configured_values_are_taken() {
        let l = Limits::from_settings(&settings(5, 2, 3));
        assert_eq!(l.max_size, 5 * MIB);
        assert_eq!(l.max_age, Duration::from_secs(2 * DAY));
        assert_eq!(l.max_count, 3);
        assert_eq!(l.cap, 5 * MIB * 5, "max_size × (max_count + 2)");
    }

    #[test]
    fn the_cap_never_passes_the_ceiling_and_always_holds_three_files() {
        // Calico's defaults would allow 11 × 100 MiB.
        assert_eq!(Limits::from_settings(&settings(0, 0, 0)).cap, CEILING);
        let huge = Limits::from_settings(&settings(i64::MAX, i64::MAX, i64::MAX));
        assert_eq!(huge.max_size, MAX_SIZE_CEILING);
        assert_eq!(huge.cap, CEILING);
        assert!(huge.max_age > Duration::from_secs(1000 * 365 * DAY));
        for (size, count) in [(1, 1), (256, 1), (300, 1), (100, 1000), (1, 0)] {
            let l = Limits::from_settings(&settings(size, 0, count));
            assert!(l.cap <= CEILING, "{l:?}");
            assert!(l.cap >= 3 * l.max_size, "{l:?}");
        }
    }
}
