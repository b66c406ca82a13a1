//! The payment saga on the onceflow engine. Built in its own issue; empty until then.
