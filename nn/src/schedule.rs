//! Learning-rate schedules.
