//! yoco-ref: a candle-core reference of paged KV memory and attention, used as a test oracle for the
//! step plans that `yoco-core` produces. Never shipped in the wheel (see issue "yoco-ref").
