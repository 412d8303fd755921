//! Names a client gives (vhosts, users, exchanges, queues, policies): their bound, the
//! characters a new one may hold, and how client input is shown back in a message.
//!
//! # Why here
//! Every name reaches the broker through a request, and every request is checked against
//! these rules before anything is looked up or proposed: [`check_bound`] before a lookup (a
//! 40 KiB name is refused as an argument, not searched for and echoed), [`check_new`] when a
//! name is created. One place decides, so a name the client API refuses is refused by the
//! definitions import and the AMQP listener alike.
//!
//! # Which characters
//! As RabbitMQ, a name is UTF-8 of at most [`MAX_NAME_BYTES`] bytes. A *new* name may not hold
//! control characters (C0 with NUL and newline, DEL, C1) nor the invisible format characters
//! that reorder or hide text (bidi embeddings, overrides and isolates such as U+202E,
//! zero-width characters, the byte-order mark): they make a name that prints as another one,
//! breaks a log line or a metrics page. Lookups check only the bound, so a name created before
//! this rule can still be found and deleted.
//!
//! # Showing client input
//! A message never carries more than [`SHOWN_CHARS`] characters of client input, with control
//! and format characters escaped: [`shown`] is the one way to put client input in a message.

use crate::error::MetaError;

/// Longest vhost, user, exchange, queue or policy name, in bytes (AMQP shortstr).
pub const MAX_NAME_BYTES: usize = 255;
/// Characters of client input a message shows, at most.
pub const SHOWN_CHARS: usize = 64;

/// The bound of a name, checked before it is looked up: INVALID_ARGUMENT naming `field`.
pub fn check_bound(field: &str, name: &str) -> Result<(), MetaError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(MetaError::invalid(format!(
            "{field}: {} bytes, more than {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    Ok(())
}

/// The bound and the characters of a name being created: INVALID_ARGUMENT naming `field`,
/// the character and why.
pub fn check_new(field: &str, name: &str) -> Result<(), MetaError> {
    check_bound(field, name)?;
    if let Some(c) = name.chars().find(|&c| is_refused(c)) {
        let what = if c.is_control() {
            "a control character"
        } else {
            "an invisible format character"
        };
        return Err(MetaError::invalid(format!(
            "{field}: contains U+{:04X}, {what}; a name may not hold control or bidi/format \
             characters",
            c as u32
        )));
    }
    Ok(())
}

/// Whether a new name may not hold `c`: a control character (C0, DEL, C1) or a format
/// character that reorders or hides text.
pub fn is_refused(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}'                  // soft hyphen
            | '\u{061C}'                // Arabic letter mark
            | '\u{180E}'                // Mongolian vowel separator
            | '\u{200B}'..='\u{200F}'   // zero-width space, (non-)joiner, LRM, RLM
            | '\u{2028}'..='\u{202E}'   // line/paragraph separators, bidi embeddings, overrides
            | '\u{2060}'..='\u{206F}'   // word joiner, invisible operators, bidi isolates
            | '\u{FEFF}'                // byte-order mark
            | '\u{FFF9}'..='\u{FFFB}') // interlinear annotations
}

/// Client input as a message shows it: at most [`SHOWN_CHARS`] characters, control and
/// format characters escaped, and the input's full size when it was cut.
pub fn shown(input: &str) -> String {
    let mut out = String::new();
    for (i, c) in input.chars().enumerate() {
        if i == SHOWN_CHARS {
            out.push_str(&format!("…({} bytes)", input.len()));
            return out;
        }
        if is_refused(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_names_refuse_control_and_format_characters() {
        for bad in [
            "a\0b",
            "a\nb",
            "a\u{7f}",
            "a\u{85}",
            "a\u{202E}b",
            "\u{2066}x",
            "\u{FEFF}",
        ] {
            let e = check_new("name", bad).unwrap_err();
            assert!(e.message.starts_with("name: contains U+"), "{bad:?}: {e}");
        }
        for good in ["orders", "ä-ö.ü/ß", "日本語", "a b", "m\"}{\\", "emoji 🐇"] {
            check_new("name", good).unwrap();
        }
        let e = check_new("vhost", &"x".repeat(256)).unwrap_err();
        assert_eq!(e.message, "vhost: 256 bytes, more than 255");
    }

    #[test]
    fn shown_input_is_short_and_escaped() {
        assert_eq!(shown("q1"), "q1");
        assert_eq!(shown("a\nb\u{202E}"), "a\\u{a}b\\u{202e}");
        let long = "x".repeat(40 * 1024);
        let s = shown(&long);
        assert_eq!(s, format!("{}…(40960 bytes)", "x".repeat(64)));
        assert_eq!(shown(&"é".repeat(64)), "é".repeat(64));
    }
}
