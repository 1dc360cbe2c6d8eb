//! Calendar windows for tiers of `period: 1d | 1w | 1mo`: a day from local midnight, an ISO
//! week from Monday's midnight, a month from the 1st's midnight, in an IANA time zone (the
//! rule's `calendar.tz`, UTC by default). The zone rules come from `jiff` with the system's
//! zoneinfo; nothing here knows an offset. A window is [this boundary, the next), so a day is
//! 23 or 25 hours long when the clocks change in it.
//!
//! Zones are interned once per name (`Calendar` is `Copy` and small, as the algorithms' tiers
//! are); windows are computed when a counter's window ends, and for a sync round's Redis keys,
//! never per request.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use parking_lot::RwLock;

/// The length of a calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    Day,
    Week,
    Month,
}

impl CalendarUnit {
    /// As written in a config: `1d`, `1w`, `1mo`.
    pub fn as_str(self) -> &'static str {
        match self {
            CalendarUnit::Day => "1d",
            CalendarUnit::Week => "1w",
            CalendarUnit::Month => "1mo",
        }
    }

    /// A calendar period as written, if `text` is one.
    pub fn parse(text: &str) -> Option<CalendarUnit> {
        match text.trim() {
            "1d" => Some(CalendarUnit::Day),
            "1w" => Some(CalendarUnit::Week),
            "1mo" => Some(CalendarUnit::Month),
            _ => None,
        }
    }

    /// Its usual length (a day of 24 h, a week of 7 days, a month of 30 days): what sorts and
    /// sizes it beside the other tiers; its windows are the calendar's.
    pub fn nominal_ms(self) -> u64 {
        const DAY: u64 = 86_400_000;
        match self {
            CalendarUnit::Day => DAY,
            CalendarUnit::Week => 7 * DAY,
            CalendarUnit::Month => 30 * DAY,
        }
    }
}

/// Calendar windows of one unit in one time zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub unit: CalendarUnit,
    zone: u16,
}

/// The zones named so far, by name (interned: a config reload naming the same zones adds none).
static ZONES: RwLock<Vec<(String, TimeZone)>> = RwLock::new(Vec::new());

impl Calendar {
    /// Windows of `unit` in the IANA zone `tz` (`UTC` included). Err: no such zone.
    pub fn new(unit: CalendarUnit, tz: &str) -> Result<Calendar, String> {
        if let Some(i) = ZONES.read().iter().position(|(n, _)| n == tz) {
            return Ok(Calendar {
                unit,
                zone: i as u16,
            });
        }
        let zone = TimeZone::get(tz).map_err(|e| {
            format!("unknown time zone {tz:?}: expected an IANA name such as Europe/Berlin or UTC ({e})")
        })?;
        let mut zones = ZONES.write();
        if let Some(i) = zones.iter().position(|(n, _)| n == tz) {
            return Ok(Calendar {
                unit,
                zone: i as u16,
            });
        }
        let i = u16::try_from(zones.len())
            .map_err(|_| "too many distinct time zones in one process".to_string())?;
        zones.push((tz.to_string(), zone));
        Ok(Calendar { unit, zone: i })
    }

    /// The zone's name as configured.
    pub fn zone_name(&self) -> String {
        ZONES
            .read()
            .get(usize::from(self.zone))
            .map_or_else(|| "UTC".to_string(), |(n, _)| n.clone())
    }

    /// The window holding `now_ms`: its start and end (ms since the epoch, end excluded).
    pub fn window_of(&self, now_ms: u64) -> (u64, u64) {
        let tz = ZONES
            .read()
            .get(usize::from(self.zone))
            .map_or(TimeZone::UTC, |(_, z)| z.clone());
        self.window_in(&tz, now_ms).unwrap_or_else(|| {
            // out of the calendar's range (not a date of this era): a window of the usual
            // length, aligned to the epoch
            let p = self.unit.nominal_ms();
            let start = now_ms / p * p;
            (start, start + p)
        })
    }

    fn window_in(&self, tz: &TimeZone, now_ms: u64) -> Option<(u64, u64)> {
        let now = Timestamp::from_millisecond(i64::try_from(now_ms).ok()?).ok()?;
        let today = now.to_zoned(tz.clone()).date();
        let first = match self.unit {
            CalendarUnit::Day => today,
            CalendarUnit::Week => today
                .checked_sub(i64::from(today.weekday().to_monday_zero_offset()).days())
                .ok()?,
            CalendarUnit::Month => today.first_of_month(),
        };
        let next = match self.unit {
            CalendarUnit::Day => first.tomorrow().ok()?,
            CalendarUnit::Week => first.checked_add(7.days()).ok()?,
            CalendarUnit::Month => first.checked_add(1.month()).ok()?,
        };
        // local midnight (where a change of the clocks skips it, the first instant of the day)
        let midnight = |d: Date| -> Option<u64> {
            let z = d.to_zoned(tz.clone()).ok()?.start_of_day().ok()?;
            u64::try_from(z.timestamp().as_millisecond()).ok()
        };
        Some((midnight(first)?, midnight(next)?))
    }
}

#[cfg(test)]
mod tests {
    //! The instants below are written out (`date -u -d ...` agrees), not computed with jiff.
    use super::*;

    const H: u64 = 3_600_000;

    /// ms since the epoch of a UTC date and time.
    fn utc(y: i16, mo: i8, d: i8, h: i8, mi: i8) -> u64 {
        jiff::civil::date(y, mo, d)
            .at(h, mi, 0, 0)
            .to_zoned(TimeZone::UTC)
            .map(|z| z.timestamp().as_millisecond() as u64)
            .expect("a date")
    }

    fn window(unit: CalendarUnit, tz: &str, at: u64) -> (u64, u64) {
        Calendar::new(unit, tz).expect("a zone").window_of(at)
    }

    #[test]
    fn days_start_at_local_midnight_and_last_23_or_25_hours_at_dst_changes() {
        use CalendarUnit::Day;
        // Berlin: 2026-03-29 loses an hour (02:00 -> 03:00), 2026-10-25 gains one
        let (s, e) = window(Day, "Europe/Berlin", utc(2026, 3, 29, 12, 0));
        assert_eq!((s, e), (utc(2026, 3, 28, 23, 0), utc(2026, 3, 29, 22, 0)));
        assert_eq!(e - s, 23 * H);
        let (s, e) = window(Day, "Europe/Berlin", utc(2026, 10, 25, 12, 0));
        assert_eq!((s, e), (utc(2026, 10, 24, 22, 0), utc(2026, 10, 25, 23, 0)));
        assert_eq!(e - s, 25 * H);
        // the last millisecond of a day is in it, the next is in the next day
        let (_, e) = window(Day, "Europe/Berlin", utc(2026, 6, 1, 10, 0));
        assert_eq!(window(Day, "Europe/Berlin", e - 1).1, e);
        assert_eq!(window(Day, "Europe/Berlin", e).0, e);
        // New York: 2026-03-08 (23 h), 2026-11-01 (25 h)
        let (s, e) = window(Day, "America/New_York", utc(2026, 3, 8, 12, 0));
        assert_eq!((s, e), (utc(2026, 3, 8, 5, 0), utc(2026, 3, 9, 4, 0)));
        let (s, e) = window(Day, "America/New_York", utc(2026, 11, 1, 12, 0));
        assert_eq!((s, e), (utc(2026, 11, 1, 4, 0), utc(2026, 11, 2, 5, 0)));
        assert_eq!(e - s, 25 * H);
        // Adelaide, half an hour off the hour: +10:30 until 2026-04-05 03:00, then +09:30
        let (s, e) = window(Day, "Australia/Adelaide", utc(2026, 4, 5, 6, 0));
        assert_eq!((s, e), (utc(2026, 4, 4, 13, 30), utc(2026, 4, 5, 14, 30)));
        assert_eq!(e - s, 25 * H);
        // and India, +05:30 all year
        let (s, e) = window(Day, "Asia/Kolkata", utc(2026, 1, 15, 20, 0));
        assert_eq!((s, e), (utc(2026, 1, 15, 18, 30), utc(2026, 1, 16, 18, 30)));
        // Santiago skips midnight on 6 September 2026 (00:00 -> 01:00): the day starts at its
        // first instant, 01:00 -03, and has 23 hours
        let (s, e) = window(Day, "America/Santiago", utc(2026, 9, 6, 12, 0));
        assert_eq!((s, e), (utc(2026, 9, 6, 4, 0), utc(2026, 9, 7, 3, 0)));
        assert_eq!(
            window(Day, "America/Santiago", s - 1).1,
            s,
            "the 5th ends then"
        );
        // UTC
        let (s, e) = window(Day, "UTC", utc(2026, 1, 15, 20, 0));
        assert_eq!((s, e), (utc(2026, 1, 15, 0, 0), utc(2026, 1, 16, 0, 0)));
    }

    #[test]
    fn weeks_start_on_monday_and_months_on_the_first() {
        use CalendarUnit::{Month, Week};
        // 2026-11-25 is a Wednesday: its week is Monday 23rd to Monday 30th (Berlin: UTC+1)
        let (s, e) = window(Week, "Europe/Berlin", utc(2026, 11, 25, 12, 0));
        assert_eq!((s, e), (utc(2026, 11, 22, 23, 0), utc(2026, 11, 29, 23, 0)));
        // a Monday just after local midnight is the first day of its week
        let monday = utc(2026, 11, 29, 23, 0);
        assert_eq!(window(Week, "Europe/Berlin", monday).0, monday);
        assert_eq!(window(Week, "Europe/Berlin", monday - 1).1, monday);
        // the week of the clocks' change in New York has 7 x 24 - 1 hours
        let (s, e) = window(Week, "America/New_York", utc(2026, 3, 10, 12, 0));
        assert_eq!((s, e), (utc(2026, 3, 9, 4, 0), utc(2026, 3, 16, 4, 0)));
        let (s, e) = window(Week, "America/New_York", utc(2026, 3, 4, 12, 0));
        assert_eq!((s, e), (utc(2026, 3, 2, 5, 0), utc(2026, 3, 9, 4, 0)));
        assert_eq!(e - s, 7 * 24 * H - H);
        // and the week it ends in, an hour longer
        let (s, e) = window(Week, "America/New_York", utc(2026, 10, 29, 12, 0));
        assert_eq!((s, e), (utc(2026, 10, 26, 4, 0), utc(2026, 11, 2, 5, 0)));
        assert_eq!(e - s, 7 * 24 * H + H);
        // months: from the 1st; October in Berlin has 31 days and one hour more
        let (s, e) = window(Month, "Europe/Berlin", utc(2026, 10, 15, 0, 0));
        assert_eq!((s, e), (utc(2026, 9, 30, 22, 0), utc(2026, 10, 31, 23, 0)));
        assert_eq!(e - s, 31 * 24 * H + H);
        // February, in New York and in UTC; December into January
        let (s, e) = window(Month, "America/New_York", utc(2028, 2, 29, 12, 0));
        assert_eq!((s, e), (utc(2028, 2, 1, 5, 0), utc(2028, 3, 1, 5, 0)));
        let (s, e) = window(Month, "UTC", utc(2026, 12, 31, 23, 59));
        assert_eq!((s, e), (utc(2026, 12, 1, 0, 0), utc(2027, 1, 1, 0, 0)));
        // the 1st at 00:30 local time in Adelaide is still the month that begins then
        let first = utc(2026, 11, 30, 13, 30); // 2026-12-01 00:00 +10:30
        assert_eq!(window(Month, "Australia/Adelaide", first + H / 2).0, first);
    }

    #[test]
    fn zones_are_checked_and_interned() {
        assert!(Calendar::new(CalendarUnit::Day, "Europe/Berln")
            .unwrap_err()
            .contains("unknown time zone \"Europe/Berln\""));
        let a = Calendar::new(CalendarUnit::Day, "Asia/Kolkata").expect("a zone");
        let b = Calendar::new(CalendarUnit::Month, "Asia/Kolkata").expect("a zone");
        assert_eq!(a.zone, b.zone);
        assert_eq!(a.zone_name(), "Asia/Kolkata");
    }
}
