//! `strftime_now(format)` for chat templates (Llama 3.1+ writes "Today Date: 26 Jul 2024").
//!
//! transformers calls `datetime.now().strftime(format)`, i.e. local time. We use UTC, which is the
//! local time of the containers this runs in; a template's date only matters to the prompt text.
//! Directives are C89/POSIX ones Python passes to the C library, with the C locale's names.

use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DateTime {
    pub year: i64,
    pub month: u32, // 1..=12
    pub day: u32,   // 1..=31
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub weekday: u32,  // 0 = Sunday
    pub year_day: u32, // 1..=366
}

impl DateTime {
    pub fn now_utc() -> Self {
        let secs = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        };
        Self::from_unix(secs)
    }

    /// Civil date from days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let year_day = BEFORE[month as usize - 1] + day + u32::from(leap && month > 2);
        Self {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            weekday: (days + 4).rem_euclid(7) as u32, // 1970-01-01 was a Thursday
            year_day,
        }
    }
}

/// Formats `t` per `format`. Unknown directives are copied through, as glibc does.
pub(crate) fn strftime(format: &str, t: &DateTime) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        match d {
            'Y' => out.push_str(&t.year.to_string()),
            'y' => out.push_str(&format!("{:02}", t.year.rem_euclid(100))),
            'C' => out.push_str(&format!("{:02}", t.year.div_euclid(100))),
            'm' => out.push_str(&format!("{:02}", t.month)),
            'd' => out.push_str(&format!("{:02}", t.day)),
            'e' => out.push_str(&format!("{:2}", t.day)),
            'j' => out.push_str(&format!("{:03}", t.year_day)),
            'H' => out.push_str(&format!("{:02}", t.hour)),
            'I' => out.push_str(&format!("{hour12:02}")),
            'M' => out.push_str(&format!("{:02}", t.minute)),
            'S' => out.push_str(&format!("{:02}", t.second)),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'B' => out.push_str(MONTHS[t.month as usize - 1]),
            'b' | 'h' => out.push_str(&MONTHS[t.month as usize - 1][..3]),
            'A' => out.push_str(DAYS[t.weekday as usize]),
            'a' => out.push_str(&DAYS[t.weekday as usize][..3]),
            'w' => out.push_str(&t.weekday.to_string()),
            'u' => out.push_str(&(if t.weekday == 0 { 7 } else { t.weekday }).to_string()),
            'D' => out.push_str(&strftime("%m/%d/%y", t)),
            'F' => out.push_str(&strftime("%Y-%m-%d", t)),
            'T' => out.push_str(&strftime("%H:%M:%S", t)),
            'R' => out.push_str(&strftime("%H:%M", t)),
            'c' => out.push_str(&strftime("%a %b %e %H:%M:%S %Y", t)),
            'x' => out.push_str(&strftime("%m/%d/%y", t)),
            'X' => out.push_str(&strftime("%H:%M:%S", t)),
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            other => {
                out.push('%');
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = DateTime::from_unix(1_721_999_109);
        assert_eq!((t.year, t.month, t.day), (2024, 7, 26));
        assert_eq!(strftime("%d %b %Y", &t), "26 Jul 2024");
        assert_eq!(strftime("%A %B %j %% %I%p %T", &t), "Friday July 208 % 01PM 13:05:09");
        let epoch = DateTime::from_unix(0);
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S %a %Q", &epoch), "1970-01-01 00:00:00 Thu %Q");
        let t = DateTime::from_unix(951_782_400); // 2000-02-29
        assert_eq!(strftime("%F %j %I%p", &t), "2000-02-29 060 12AM");
    }
}
