//! Examples live in `examples/`; this package only owns them.
