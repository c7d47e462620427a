//! Loss and accuracy curves written as an SVG plot.
