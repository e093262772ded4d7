//! `pysigma._pysigma`: the σOS API for Python, spoken over the spproxy protocol.
#![forbid(unsafe_code)]

use pyo3::prelude::*;

#[pymodule]
fn _pysigma(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
