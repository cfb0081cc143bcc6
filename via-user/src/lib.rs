//! VI provider library.
