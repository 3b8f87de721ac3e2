//! The media seam: how a chat request's images and audio (and a transcription's upload) become a
//! prompt with placeholder runs, without this crate decoding anything.
//!
//! Fetching (data URLs, `file://` under `--allowed-local-media-path`, http(s) with a timeout and a
//! size cap), decoding, the checkpoint's processor and the encoder stay in Python (the bindings crate
//! implements [`MediaSeam`] by calling it with the GIL); this crate parses and validates the request,
//! renders the template with `{"type": "image"}` / `{"type": "audio"}` parts, checks
//! `--limit-mm-per-prompt`, and hands the rendered prompt and the refs, in order, to the seam on the
//! blocking pool (decoding and encoding ahead are heavy: never on the accept path or the step loop).
//! The seam answers the token ids, the placeholder runs (which key the prefix cache and the encoder
//! budget in the core) and an opaque [`MediaItems`] handle the executor receives with the request.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub use yoco_core::kv::MmPlaceholder;

use crate::openai::ApiError;

/// What kind of item a content part carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Modality {
    /// `image_url` parts.
    Image,
    /// `input_audio` and `audio_url` parts.
    Audio,
}

impl Modality {
    /// The name `--limit-mm-per-prompt` and the template use (`image`, `audio`).
    pub fn name(self) -> &'static str {
        match self {
            Modality::Image => "image",
            Modality::Audio => "audio",
        }
    }
}

/// Where an item's bytes come from, as the client sent it (resolved by the seam).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaSource {
    /// `image_url.url` / `audio_url.url`: a data URL, `file://` or http(s).
    Url(String),
    /// `input_audio`: base64 data and its declared format (`wav`, `mp3`, `flac`...).
    Inline {
        /// Base64 payload, not decoded here.
        data: String,
        /// The part's `format`, if given.
        format: Option<String>,
    },
}

/// One media content part of a request, in the order the conversation has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaRef {
    /// Image or audio.
    pub modality: Modality,
    /// `messages[i].content[j]`: what errors about this item name.
    pub location: String,
    /// Its bytes' origin.
    pub source: MediaSource,
}

/// The processed items of one prompt, opaque to this crate (the bindings hold Python objects in
/// it): cloned into every choice of the request, handed to [`crate::Executor::add_request`] with
/// [`MediaInputs`], and freed when the last clone drops.
#[derive(Clone)]
pub struct MediaItems(pub Arc<dyn Any + Send + Sync>);

impl fmt::Debug for MediaItems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MediaItems(..)")
    }
}

/// A request's media as the step loop and the executor see it.
#[derive(Debug, Clone)]
pub struct MediaInputs {
    /// The items' placeholder runs in the prompt, sorted by offset (the core's `add_request_mm`).
    pub placeholders: Vec<MmPlaceholder>,
    /// The processed items (encoder inputs, or embeddings encoded ahead).
    pub items: MediaItems,
}

/// A prompt with its media resolved.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The expanded prompt's token ids.
    pub token_ids: Vec<u32>,
    /// Its media (placeholders and items).
    pub media: MediaInputs,
}

/// Why the seam could not prepare a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaError {
    /// The client's media is at fault (a 400); the message names the part.
    Bad(String),
    /// The server failed (a 500).
    Internal(String),
}

impl From<MediaError> for ApiError {
    fn from(e: MediaError) -> Self {
        match e {
            MediaError::Bad(m) => ApiError::bad(m, Some("messages")),
            MediaError::Internal(m) => ApiError::status(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("media processing failed: {m}"),
            ),
        }
    }
}

/// A transcription's upload and options, checked by the route before the seam sees them.
#[derive(Debug, Clone)]
pub struct TranscriptionAudio {
    /// The file's bytes, at most the server's media byte cap.
    pub data: Vec<u8>,
    /// Its format, from the file name's extension (None: sniffed by the decoder).
    pub format: Option<String>,
    /// ISO 639-1 code, checked against the supported languages.
    pub language: Option<String>,
    /// Extra text after the audio in the prompt.
    pub prompt: Option<String>,
}

/// Resolves media into a prompt: the Python processor in production, a mock in cargo tests.
/// Blocking and thread-safe: called on tokio's blocking pool, several requests at once.
pub trait MediaSeam: Send + Sync + 'static {
    /// Fetches, decodes and processes `refs` (in order) and expands `rendered`'s placeholders; the
    /// ids are what the tokenizer gives the expanded text (`add_special_tokens` as the request asks).
    fn prepare(
        &self,
        rendered: &str,
        add_special_tokens: bool,
        refs: &[MediaRef],
    ) -> Result<Prepared, MediaError>;

    /// The transcription prompt of one audio upload (the same wording as the Python server's
    /// `transcription_prompt`), its errors naming `file`.
    fn transcription(&self, audio: &TranscriptionAudio) -> Result<Prepared, MediaError>;
}

/// What a multimodal server has: the seam and the per-prompt item limits.
#[derive(Clone, Default)]
pub struct MediaConfig {
    /// None: a text-only checkpoint (media parts are refused as today).
    pub seam: Option<Arc<dyn MediaSeam>>,
    /// `--limit-mm-per-prompt`: most items of a modality in one prompt (absent: no limit).
    pub limits: Vec<(Modality, u32)>,
    /// `--max-media-bytes`: the largest transcription upload the route reads.
    pub max_bytes: usize,
}

impl MediaConfig {
    /// `--limit-mm-per-prompt`, worded as the Python server words it.
    pub fn check_limits(&self, refs: &[MediaRef]) -> Result<(), ApiError> {
        for m in [Modality::Image, Modality::Audio] {
            let n = refs.iter().filter(|r| r.modality == m).count();
            if let Some(&(_, cap)) = self.limits.iter().find(|(k, _)| *k == m) {
                if n > cap as usize {
                    return Err(ApiError::bad(
                        format!(
                            "the request has {n} {} item(s); at most {cap} per prompt are allowed \
                             (--limit-mm-per-prompt)",
                            m.name()
                        ),
                        Some("messages"),
                    ));
                }
            }
        }
        Ok(())
    }
}
