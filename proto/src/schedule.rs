//! CronJob schedules as Kubernetes reads them (robfig/cron's standard parser): five fields,
//! minute hour day-of-month month day-of-week, with names (`MON`, `JAN`), ranges, lists and
//! steps, or a descriptor (`@yearly`, `@monthly`, `@weekly`, `@daily`, `@hourly`),
//! evaluated in an IANA time zone (`spec.timeZone`; UTC without one). Parsing and
//! evaluation are the `croner` crate's (it also takes `L`, `#` and `W`, which Kubernetes
//! refuses); time zones are `chrono-tz`'s database. Feature `schedule`.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// Why a schedule or time zone is refused (the message Kubernetes' validation shows).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("{0}")]
    Schedule(String),
    #[error("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")]
    TimeZoneInSchedule,
    #[error("unknown time zone {0}")]
    TimeZone(String),
}

/// A parsed schedule in its time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    tz: Tz,
}

impl Schedule {
    /// Parses `schedule` for `time_zone` (`None`: UTC).
    pub fn parse(schedule: &str, time_zone: Option<&str>) -> Result<Schedule, ScheduleError> {
        let upper = schedule.to_uppercase();
        if upper.contains("TZ=") {
            return Err(ScheduleError::TimeZoneInSchedule);
        }
        let tz = match time_zone {
            None => Tz::UTC,
            Some(name) => {
                Tz::from_str(name).map_err(|_| ScheduleError::TimeZone(name.to_string()))?
            }
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(schedule)
            .map_err(|e| ScheduleError::Schedule(e.to_string()))?;
        Ok(Schedule { cron, tz })
    }

    /// The first scheduled time strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }

    /// The latest scheduled time at or before `t`.
    pub fn latest_until(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }

    /// `t` in RFC 3339 with the schedule's zone offset (how Kubernetes stamps a CronJob's
    /// Jobs).
    pub fn local_rfc3339(&self, t: DateTime<Utc>) -> String {
        t.with_timezone(&self.tz)
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    /// The scheduled times in `(after, until]`, at most `limit` + 1 of them (the caller tells
    /// "too many" from the extra one), earliest first.
    pub fn times_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = after;
        while out.len() <= limit {
            match self.next_after(t) {
                Some(n) if n <= until => {
                    out.push(n);
                    t = n;
                }
                _ => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn five_fields_names_and_descriptors() {
        let s = Schedule::parse("*/15 9-17 * * MON-FRI", None).unwrap();
        // Saturday 2026-11-28 → Monday 09:00.
        assert_eq!(
            s.next_after(at("2026-11-28T10:00:00Z")),
            Some(at("2026-11-30T09:00:00Z"))
        );
        let daily = Schedule::parse("@daily", None).unwrap();
        assert_eq!(
            daily.next_after(at("2026-11-26T10:00:00Z")),
            Some(at("2026-11-27T00:00:00Z"))
        );
        assert!(
            Schedule::parse("* * * * * *", None).is_err(),
            "no seconds field"
        );
        assert!(Schedule::parse("61 * * * *", None).is_err());
        assert!(Schedule::parse("not a schedule", None).is_err());
        assert_eq!(
            Schedule::parse("CRON_TZ=UTC * * * * *", None).unwrap_err(),
            ScheduleError::TimeZoneInSchedule
        );
    }

    #[test]
    fn time_zones() {
        let s = Schedule::parse("0 9 * * *", Some("Europe/Berlin")).unwrap();
        // 09:00 in Berlin is 08:00 UTC in winter.
        assert_eq!(
            s.next_after(at("2026-11-26T10:00:00Z")),
            Some(at("2026-11-27T08:00:00Z"))
        );
        assert_eq!(
            Schedule::parse("0 9 * * *", Some("Mars/Olympus"))
                .unwrap_err()
                .to_string(),
            "unknown time zone Mars/Olympus"
        );
    }

    #[test]
    fn missed_times_are_bounded() {
        let s = Schedule::parse("* * * * *", None).unwrap();
        let times = s.times_between(at("2026-11-26T10:00:00Z"), at("2026-11-26T10:03:30Z"), 100);
        assert_eq!(times.len(), 3);
        assert_eq!(times[2], at("2026-11-26T10:03:00Z"));
        let many = s.times_between(at("2026-11-26T10:00:00Z"), at("2026-11-27T10:00:00Z"), 100);
        assert_eq!(many.len(), 101);
        assert_eq!(
            s.latest_until(at("2026-11-27T10:00:30Z")),
            Some(at("2026-11-27T10:00:00Z"))
        );
        assert_eq!(
            s.latest_until(at("2026-11-27T10:00:00Z")),
            Some(at("2026-11-27T10:00:00Z"))
        );
    }
}
