//! The media seam of `serve_http` (`yoco_server::media::MediaSeam`) over the Python
//! `rust_media.MediaSeam`: the Rust front end parses and validates media parts and renders the
//! template; fetching, decoding, the processor and the encoder ahead run in Python, on tokio's
//! blocking pool with the GIL held for the call. The processed items cross back as one opaque
//! Python object ([`PyItems`]) that the executor's `add_request` receives as `mm_items`.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use yoco_server::media::{
    MediaConfig, MediaError, MediaInputs, MediaItems, MediaRef, MediaSeam, MediaSource,
    MmPlaceholder, Modality, Prepared, TranscriptionAudio,
};

use crate::step_executor::exec_err;

/// `MediaSeam.prepare`'s answer: token ids, `(offset, length, identifier)` runs, the items.
type PyPrepared = (Vec<i64>, Vec<(u32, u32, String)>, Py<PyAny>);

/// A prompt's processed media items: the Python list `MediaSeam.prepare` returned.
pub(crate) struct PyItems(pub(crate) Py<PyAny>);

/// `yoco_server::media::MediaSeam` over `python/yoco_rs/serve/rust_media.py::MediaSeam`: called on
/// tokio's blocking pool, the GIL held for the call (fetching, decoding, the processor, the encoder).
struct PyMediaSeam(Py<PyAny>);

impl PyMediaSeam {
    /// A Python answer: `(ids, [(offset, length, identifier)], items)`, or a message for a 400.
    fn read(py: Python<'_>, r: PyResult<Py<PyAny>>) -> Result<Prepared, MediaError> {
        let r = r.map_err(|e| MediaError::Internal(exec_err(py, e).0))?;
        let r = r.bind(py);
        if let Ok(msg) = r.extract::<String>() {
            return Err(MediaError::Bad(msg));
        }
        let internal = |e: PyErr| MediaError::Internal(e.to_string());
        let (ids, places, items): PyPrepared = r.extract().map_err(internal)?;
        let token_ids = ids
            .into_iter()
            .map(|t| u32::try_from(t).map_err(|_| MediaError::Internal(format!("token id {t}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let placeholders = places.into_iter().map(MmPlaceholder::from).collect();
        Ok(Prepared {
            token_ids,
            media: MediaInputs {
                placeholders,
                items: MediaItems(Arc::new(PyItems(items))),
            },
        })
    }
}

impl MediaSeam for PyMediaSeam {
    fn prepare(
        &self,
        rendered: &str,
        add_special_tokens: bool,
        refs: &[MediaRef],
    ) -> Result<Prepared, MediaError> {
        Python::attach(|py| {
            let list: Vec<_> = refs
                .iter()
                .map(|r| {
                    let (url, data, fmt) = match &r.source {
                        MediaSource::Url(u) => (Some(u.as_str()), None, None),
                        MediaSource::Inline { data, format } => {
                            (None, Some(data.as_str()), format.as_deref())
                        }
                    };
                    (r.modality.name(), r.location.as_str(), url, data, fmt)
                })
                .collect();
            let r = self
                .0
                .call_method1(py, "prepare", (rendered, add_special_tokens, list));
            Self::read(py, r)
        })
    }

    fn transcription(&self, a: &TranscriptionAudio) -> Result<Prepared, MediaError> {
        Python::attach(|py| {
            let data = pyo3::types::PyBytes::new(py, &a.data);
            let r = self.0.call_method1(
                py,
                "transcription",
                (
                    data,
                    a.format.as_deref(),
                    a.language.as_deref(),
                    a.prompt.as_deref(),
                ),
            );
            Self::read(py, r)
        })
    }
}

/// `--limit-mm-per-prompt` as `(modality, count)` pairs; other modalities are refused at start.
pub(crate) fn media_config(
    seam: Option<Py<PyAny>>,
    limits: Vec<(String, u32)>,
    max_bytes: usize,
) -> PyResult<MediaConfig> {
    let limits = limits
        .into_iter()
        .map(|(k, n)| match k.as_str() {
            "image" => Ok((Modality::Image, n)),
            "audio" => Ok((Modality::Audio, n)),
            _ => Err(PyValueError::new_err(format!(
                "limit_mm_per_prompt: unknown modality {k:?} (image, audio)"
            ))),
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(MediaConfig {
        seam: seam.map(|s| Arc::new(PyMediaSeam(s)) as Arc<dyn MediaSeam>),
        limits,
        max_bytes,
    })
}
