//! qq-client
