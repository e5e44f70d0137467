//! JSON documents: each names the version and kind of its output, and numbers are rounded
//! where they are written, so that no float noise (1.3959000000000001) reaches a reader.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};

/// Decimals kept of every fractional number.
pub(crate) const DECIMALS: i32 = 4;

/// `value` rounded to [`DECIMALS`]; values too large to have decimals are kept as they are.
pub(crate) fn round(value: f64) -> f64 {
    let scale = 10f64.powi(DECIMALS);
    if !value.is_finite() || value.abs() >= 1e12 {
        return value;
    }
    let rounded = (value * scale).round() / scale;
    // No "-0.0" for a small negative value.
    if rounded == 0.0 { 0.0 } else { rounded }
}

#[derive(Serialize)]
struct Document<'a, T> {
    version: &'static str,
    kind: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

/// Writes `body` (a struct) as one pretty-printed object that starts with `version` and `kind`.
pub(crate) fn write<T: Serialize>(
    out: &mut impl Write,
    kind: &'static str,
    body: &T,
) -> io::Result<()> {
    let document = Document {
        version: env!("CARGO_PKG_VERSION"),
        kind,
        body,
    };
    let mut serializer = serde_json::Serializer::with_formatter(&mut *out, Rounded::default());
    document.serialize(&mut serializer)?;
    writeln!(out)
}

/// serde_json's pretty printer with every float rounded.
#[derive(Default)]
struct Rounded(PrettyFormatter<'static>);

impl Formatter for Rounded {
    fn write_f32<W: ?Sized + Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(writer, f64::from(value))
    }

    fn write_f64<W: ?Sized + Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        self.0.write_f64(writer, round(value))
    }

    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_array(writer)
    }

    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array(writer)
    }

    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(writer, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array_value(writer)
    }

    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object(writer)
    }

    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object(writer)
    }

    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(writer, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object_value(writer)
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object_value(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Sample {
        ratio: f64,
        small: f64,
        count: u64,
        list: Vec<f64>,
    }

    #[test]
    fn floats_are_rounded_and_the_document_is_named() {
        let sample = Sample {
            ratio: 1.3959000000000001,
            small: -0.00001,
            count: 7,
            list: vec![2.0 / 3.0, 12.5],
        };
        let mut out = Vec::new();
        write(&mut out, "sample", &sample).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("{\n  \"version\": \""), "{text}");
        for expected in [
            "\"kind\": \"sample\"",
            "\"ratio\": 1.3959,",
            "\"small\": 0.0,",
            "\"count\": 7,",
            "0.6667,",
            "12.5\n",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
        assert!(text.ends_with("}\n"));
    }
}
