//! Parsers of measurements other tools write, for `tessel calibrate`: each reads one format
//! into typed rows and rejects anything else with the line that gave it away.
//!
//! - [`nccl_tests`]: the output of NVIDIA's nccl-tests (`all_reduce_perf`, ...).

pub mod nccl_tests;

pub use nccl_tests::{
    parse_nccl_tests, NcclTestsDevice, NcclTestsError, NcclTestsRow, NcclTestsRun,
};
