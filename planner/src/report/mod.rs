//! `tessel report`: one self-contained HTML page (inline CSS and SVG, no scripts, no network)
//! showing a plan's predicted pipeline timeline, per-stage memory, step-time breakdown,
//! configuration and runners-up, and optionally the measured timeline of a traced run.

mod error;
mod escape;
mod format;
mod html;
mod measured;
mod svg;
mod timeline;

pub use error::ReportError;
pub use escape::escape;
pub use html::render_report;
pub use measured::{
    disagreements, parse_trace, Disagreement, EventKind, MeasuredEvent, MeasuredLane,
    MeasuredTimeline,
};
pub use svg::palette;
pub use timeline::{
    predicted_timeline, simulate, stage_durations, Pass, PredictedTimeline, StageDurations,
    StageLane, WorkBox,
};
