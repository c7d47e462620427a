//! The register types of each tier and the operations the wide math is written with.
