//! AMQP 0-9-1 reply codes, and the one mapping of the broker's gRPC statuses onto them.
//!
//! Soft errors close the channel (403, 404, 405, 406); hard errors close the connection
//! (320, 501-506, 530, 540, 541), as the specification and RabbitMQ do. The reply text is
//! RabbitMQ's shape: the code's name, " - ", then the broker's message (which names the field
//! and the reason, as on gRPC).

use tonic::{Code, Status};

pub const REPLY_SUCCESS: u16 = 200;
pub const NO_ROUTE: u16 = 312;
pub const CONNECTION_FORCED: u16 = 320;
pub const ACCESS_REFUSED: u16 = 403;
pub const NOT_FOUND: u16 = 404;
pub const RESOURCE_LOCKED: u16 = 405;
pub const PRECONDITION_FAILED: u16 = 406;
pub const FRAME_ERROR: u16 = 501;
pub const SYNTAX_ERROR: u16 = 502;
pub const COMMAND_INVALID: u16 = 503;
pub const CHANNEL_ERROR: u16 = 504;
pub const UNEXPECTED_FRAME: u16 = 505;
pub const NOT_ALLOWED: u16 = 530;
pub const NOT_IMPLEMENTED: u16 = 540;
pub const INTERNAL_ERROR: u16 = 541;

/// The name RabbitMQ puts before a reply text.
pub fn name(code: u16) -> &'static str {
    match code {
        REPLY_SUCCESS => "OK",
        NO_ROUTE => "NO_ROUTE",
        CONNECTION_FORCED => "CONNECTION_FORCED",
        ACCESS_REFUSED => "ACCESS_REFUSED",
        NOT_FOUND => "NOT_FOUND",
        RESOURCE_LOCKED => "RESOURCE_LOCKED",
        PRECONDITION_FAILED => "PRECONDITION_FAILED",
        FRAME_ERROR => "FRAME_ERROR",
        SYNTAX_ERROR => "SYNTAX_ERROR",
        COMMAND_INVALID => "COMMAND_INVALID",
        CHANNEL_ERROR => "CHANNEL_ERROR",
        UNEXPECTED_FRAME => "UNEXPECTED_FRAME",
        NOT_ALLOWED => "NOT_ALLOWED",
        NOT_IMPLEMENTED => "NOT_IMPLEMENTED",
        _ => "INTERNAL_ERROR",
    }
}

/// Whether `code` closes the connection rather than the channel.
pub fn is_hard(code: u16) -> bool {
    !matches!(
        code,
        ACCESS_REFUSED | NOT_FOUND | RESOURCE_LOCKED | PRECONDITION_FAILED
    )
}

/// An error that closes the connection.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnError {
    pub code: u16,
    pub text: String,
    /// The method that caused it (0, 0: none).
    pub class_method: (u16, u16),
}

impl ConnError {
    pub fn new(code: u16, text: impl Into<String>) -> ConnError {
        ConnError {
            code,
            text: text.into(),
            class_method: (0, 0),
        }
    }
}

/// An error answering a method: closes its channel when soft, the connection when hard.
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpError {
    pub code: u16,
    pub text: String,
}

impl AmqpError {
    pub fn new(code: u16, text: impl Into<String>) -> AmqpError {
        AmqpError {
            code,
            text: text.into(),
        }
    }

    /// The reply text: `NAME - message`, within a short string's 255 bytes.
    pub fn reply_text(&self) -> String {
        super::convert::clip(&format!("{} - {}", name(self.code), self.text))
    }
}

impl From<Status> for AmqpError {
    /// NOT_FOUND → 404; PERMISSION_DENIED and UNAUTHENTICATED → 403 ACCESS_REFUSED; the
    /// client's mistakes and the broker's refusals (INVALID_ARGUMENT, FAILED_PRECONDITION,
    /// ALREADY_EXISTS, RESOURCE_EXHAUSTED, OUT_OF_RANGE) → 406 PRECONDITION_FAILED, as
    /// RabbitMQ answers them; UNAVAILABLE and the rest (no majority, leader moved, shutting
    /// down) → 541 INTERNAL_ERROR on the connection, which clients answer by reconnecting.
    fn from(s: Status) -> AmqpError {
        let code = match s.code() {
            Code::NotFound => NOT_FOUND,
            Code::PermissionDenied | Code::Unauthenticated => ACCESS_REFUSED,
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::ResourceExhausted
            | Code::OutOfRange => PRECONDITION_FAILED,
            _ => INTERNAL_ERROR,
        };
        AmqpError::new(code, s.message().to_string())
    }
}

impl From<ConnError> for AmqpError {
    fn from(e: ConnError) -> AmqpError {
        AmqpError::new(e.code, e.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_rabbitmqs_codes() {
        let code = |s: Status| AmqpError::from(s).code;
        assert_eq!(code(Status::not_found("x")), NOT_FOUND);
        assert_eq!(code(Status::permission_denied("x")), ACCESS_REFUSED);
        assert_eq!(code(Status::invalid_argument("x")), PRECONDITION_FAILED);
        assert_eq!(code(Status::already_exists("x")), PRECONDITION_FAILED);
        assert_eq!(code(Status::unavailable("x")), INTERNAL_ERROR);
        assert!(!is_hard(NOT_FOUND) && is_hard(INTERNAL_ERROR) && is_hard(NOT_ALLOWED));
        let e = AmqpError::new(NOT_FOUND, "x".repeat(400));
        assert!(e.reply_text().starts_with("NOT_FOUND - xxx"));
        assert!(e.reply_text().len() <= 255);
    }
}
