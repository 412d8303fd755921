//! integration test support
