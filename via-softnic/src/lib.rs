//! Software frame devices.
