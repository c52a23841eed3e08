//! String formats checked for custom resources: the formats apiextensions
//! keeps (supportedFormats in
//! staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/formats.go)
//! as kube-openapi's strfmt registry checks them. Other formats (int32,
//! int64, float, double, and unknown names) are not checked, as in Kubernetes.

use std::net::IpAddr;
use std::sync::OnceLock;

use base64::Engine;
use regex::Regex;

fn re(cell: &'static OnceLock<Option<Regex>>, pat: &str) -> Option<&'static Regex> {
    cell.get_or_init(|| Regex::new(pat).ok()).as_ref()
}

fn matches(cell: &'static OnceLock<Option<Regex>>, pat: &str, s: &str) -> bool {
    re(cell, pat).is_some_and(|r| r.is_match(s))
}

/// True if `s` is valid for `format` (unknown formats accept anything).
pub(crate) fn is_valid(format: &str, s: &str) -> bool {
    static UUID: OnceLock<Option<Regex>> = OnceLock::new();
    static UUID3: OnceLock<Option<Regex>> = OnceLock::new();
    static UUID4: OnceLock<Option<Regex>> = OnceLock::new();
    static UUID5: OnceLock<Option<Regex>> = OnceLock::new();
    static HOSTNAME: OnceLock<Option<Regex>> = OnceLock::new();
    static EMAIL: OnceLock<Option<Regex>> = OnceLock::new();
    static HEXCOLOR: OnceLock<Option<Regex>> = OnceLock::new();
    static RGBCOLOR: OnceLock<Option<Regex>> = OnceLock::new();
    static SSN: OnceLock<Option<Regex>> = OnceLock::new();
    static BSON: OnceLock<Option<Regex>> = OnceLock::new();
    static DURATION: OnceLock<Option<Regex>> = OnceLock::new();
    static MAC: OnceLock<Option<Regex>> = OnceLock::new();
    match format {
        "byte" => base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
        "date" => chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok() && s.len() == 10,
        "date-time" | "datetime" => is_date_time(s),
        "uuid" => matches(
            &UUID,
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
            s,
        ),
        "uuid3" => matches(
            &UUID3,
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
            s,
        ),
        "uuid4" => matches(
            &UUID4,
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$",
            s,
        ),
        "uuid5" => matches(
            &UUID5,
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$",
            s,
        ),
        "hostname" => {
            s.len() <= 255
                && matches(
                    &HOSTNAME,
                    r"^([a-zA-Z0-9\p{S}\p{L}]((-?[a-zA-Z0-9\p{S}\p{L}]{0,62})?)|([a-zA-Z0-9\p{S}\p{L}](([a-zA-Z0-9-\p{S}\p{L}]{0,61}[a-zA-Z0-9\p{S}\p{L}])?)(\.)){1,}([a-zA-Z\p{L}]){2,63})$",
                    s,
                )
        }
        "ipv4" => s.parse::<IpAddr>().is_ok() && s.contains('.'),
        "ipv6" => s.parse::<IpAddr>().is_ok() && s.contains(':'),
        "cidr" => is_cidr(s),
        "email" => matches(&EMAIL, r"^[^@\s<>()\[\],;:]+@[^@\s<>()\[\],;:]+$", s),
        "mac" => matches(
            &MAC,
            r"^([0-9a-fA-F]{2}([:-])){5}[0-9a-fA-F]{2}$|^([0-9a-fA-F]{2}([:-])){7}[0-9a-fA-F]{2}$|^([0-9a-fA-F]{2}([:-])){19}[0-9a-fA-F]{2}$|^([0-9a-fA-F]{4}\.){2}[0-9a-fA-F]{4}$",
            s,
        ),
        "hexcolor" => matches(&HEXCOLOR, r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$", s),
        "rgbcolor" => matches(
            &RGBCOLOR,
            r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$",
            s,
        ),
        "ssn" => matches(&SSN, r"^\d{3}[- ]?\d{2}[- ]?\d{4}$", s),
        "bsonobjectid" => matches(&BSON, r"^[0-9a-fA-F]{24}$", s),
        "duration" => matches(
            &DURATION,
            r"^[-+]?((\d+(\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s|m|h|d|w|[a-z]+))+$",
            s,
        ),
        // uri, isbn*, creditcard, password and everything else: not checked.
        _ => true,
    }
}

/// strfmt's DateTime layouts: RFC 3339 with optional fractional seconds, and
/// the same without a zone.
fn is_date_time(s: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(s).is_ok()
        || chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").is_ok()
        || chrono::DateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f%z").is_ok()
}

/// net.ParseCIDR.
fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(addr) = ip.parse::<IpAddr>() else {
        return false;
    };
    if bits.is_empty() || bits.len() > 3 || !bits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let Ok(n) = bits.parse::<u32>() else {
        return false;
    };
    match addr {
        IpAddr::V4(_) => n <= 32,
        IpAddr::V6(_) => n <= 128,
    }
}

#[cfg(test)]
mod tests {
    use super::is_valid;

    #[test]
    fn formats_table() {
        let cases = [
            ("ipv4", "10.0.0.1", true),
            ("ipv4", "10.0.0", false),
            ("ipv4", "::1", false),
            ("ipv6", "::1", true),
            ("ipv6", "10.0.0.1", false),
            ("cidr", "10.0.0.0/8", true),
            ("cidr", "10.0.0.0/33", false),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
            ("uuid", "nope", false),
            ("date", "2024-02-29", true),
            ("date", "2023-02-29", false),
            ("date-time", "2024-01-02T03:04:05Z", true),
            ("date-time", "2024-01-02 03:04", false),
            ("byte", "aGVsbG8=", true),
            ("byte", "%%%", false),
            ("hostname", "example.com", true),
            ("hostname", "-bad-", false),
            ("email", "a@b.c", true),
            ("email", "ab.c", false),
            ("int32", "whatever", true),
        ];
        for (f, s, ok) in cases {
            assert_eq!(is_valid(f, s), ok, "{f} {s}");
        }
    }
}
