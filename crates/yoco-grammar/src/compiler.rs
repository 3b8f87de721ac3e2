//! Compiling constraints once per tokenizer, off the step loop, under a budget; cached by canonical text.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llguidance::toktrie::{TokEnv, TokenId};
use llguidance::{Matcher, ParserFactory};
use rustc_hash::FxHashMap;
use toktrie_hf_tokenizers::ByteTokenizer;

use crate::spec::{GrammarKind, GrammarSpec};
use crate::GrammarError;

/// Budgets that bound what one grammar may cost (vLLM leaves these to the backend's defaults).
#[derive(Clone, Debug)]
pub struct CompileLimits {
    /// Wall-clock budget of one compilation (including the first mask); over it the request is refused.
    pub time_budget_ms: u64,
    /// llguidance's grammar size limit (symbols in productions).
    pub max_grammar_size: usize,
    /// llguidance's lexer-construction fuel (bounds regex blow-up, e.g. huge enums or nested patterns).
    pub initial_lexer_fuel: u64,
    /// Compilations running at once; a compilation that outlived its budget still counts until it ends.
    pub max_in_flight: usize,
    /// Compiled grammars kept (least recently inserted dropped first).
    pub cache_size: usize,
}

impl Default for CompileLimits {
    fn default() -> Self {
        Self { time_budget_ms: 10_000, max_grammar_size: 500_000, initial_lexer_fuel: 1_000_000, max_in_flight: 4, cache_size: 256 }
    }
}

/// Matchers started from one lexer cache before it is replaced by a fresh one (bounds its growth).
const SHARED_LEXER_USES: usize = 256;

/// A compiled constraint: a fresh matcher to clone for each sequence that uses it.
///
/// Sequences of one grammar share its lexer cache (llguidance's lazily built DFA states, behind a
/// mutex): a new sequence starts warm, with the states earlier ones built, which at 262k tokens is
/// the difference between ~20 µs and milliseconds per mask. The cost is that rows of one grammar take
/// that mutex in turn. Every `SHARED_LEXER_USES` sequences the cache starts again from the pristine
/// compiled grammar, so a long-lived server's cache does not grow without bound.
pub struct CompiledGrammar {
    pub kind: GrammarKind,
    pristine: Matcher,
    warm: Mutex<(Matcher, usize)>,
}

impl CompiledGrammar {
    fn new(kind: GrammarKind, m: Matcher) -> Self {
        let warm = Mutex::new((m.deep_clone(), 0));
        Self { kind, pristine: m, warm }
    }

    /// A new matcher at the start of the grammar (its own parser state; a shared lexer cache).
    pub fn new_matcher(&self) -> Matcher {
        let mut w = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        if w.1 >= SHARED_LEXER_USES {
            *w = (self.pristine.deep_clone(), 0);
        }
        w.1 += 1;
        w.0.clone()
    }
}

/// The tokenizer's token trie (built once: it is the expensive part at 262k tokens) and the cache.
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    limits: CompileLimits,
    cache: Mutex<Cache>,
    in_flight: Arc<AtomicUsize>,
    vocab_size: usize,
    eos_ids: Vec<TokenId>,
}

#[derive(Default)]
struct Cache {
    map: FxHashMap<(GrammarKind, String), Arc<CompiledGrammar>>,
    order: VecDeque<(GrammarKind, String)>,
}

impl GrammarCompiler {
    /// From a `tokenizer.json`'s bytes. `vocab_size` is the model's (logits width, >= the tokenizer's
    /// count: the extra ids are never allowed); `eos_ids` the ids that end a sequence, allowed only
    /// where the grammar accepts.
    pub fn from_tokenizer_json(json: &[u8], vocab_size: usize, eos_ids: &[u32], limits: CompileLimits) -> Result<Self, GrammarError> {
        let mut bt = ByteTokenizer::from_json_bytes(json).map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        let n = bt.tokrx_info().vocab_size as usize;
        let eos: Vec<u32> = eos_ids.iter().copied().filter(|&t| (t as usize) < n).collect();
        if !eos.is_empty() {
            bt.set_eos_tokens(&eos);
        }
        let env: TokEnv = bt.into_tok_env(Some(vocab_size.max(n))).map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        factory.quiet();
        let l = factory.limits_mut();
        l.max_grammar_size = limits.max_grammar_size;
        l.initial_lexer_fuel = limits.initial_lexer_fuel;
        Ok(Self {
            factory: Arc::new(factory),
            limits,
            cache: Mutex::new(Cache::default()),
            in_flight: Arc::new(AtomicUsize::new(0)),
            vocab_size: vocab_size.max(n),
            eos_ids: eos,
        })
    }

    /// Logits width the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn eos_ids(&self) -> &[TokenId] {
        &self.eos_ids
    }

    pub fn limits(&self) -> &CompileLimits {
        &self.limits
    }

    /// Compiled grammars in the cache.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).map.len()
    }

    /// Compile `spec` (or take it from the cache). Runs on its own thread; the caller waits at most
    /// the time budget. Blocking: call it off the step loop.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Arc<CompiledGrammar>, GrammarError> {
        let key = (spec.kind, spec.canonical.clone());
        if let Some(g) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).map.get(&key) {
            return Ok(g.clone());
        }
        let limit = self.limits.max_in_flight;
        if self.in_flight.fetch_add(1, Ordering::SeqCst) >= limit {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(GrammarError::Busy { limit });
        }
        let (tx, rx) = mpsc::channel();
        let factory = self.factory.clone();
        let in_flight = self.in_flight.clone();
        let grammar = spec.grammar();
        let kind = spec.kind;
        std::thread::spawn(move || {
            let r = compile_now(&factory, kind, grammar);
            in_flight.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(r);
        });
        let budget_ms = self.limits.time_budget_ms;
        let compiled = match rx.recv_timeout(Duration::from_millis(budget_ms)) {
            Ok(r) => Arc::new(r?),
            Err(_) => return Err(GrammarError::Timeout { budget_ms }),
        };
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if c.map.insert(key.clone(), compiled.clone()).is_none() {
            c.order.push_back(key);
        }
        while c.order.len() > self.limits.cache_size.max(1) {
            if let Some(old) = c.order.pop_front() {
                c.map.remove(&old);
            }
        }
        Ok(compiled)
    }
}

fn compile_now(factory: &ParserFactory, kind: GrammarKind, grammar: llguidance::api::TopLevelGrammar) -> Result<CompiledGrammar, GrammarError> {
    let invalid = |message: String| GrammarError::Invalid { kind: kind.name(), message };
    let parser = factory.create_parser(grammar).map_err(|e| invalid(e.to_string()))?;
    let mut m = Matcher::new(Ok(parser));
    // The first mask builds the lexer's initial states: errors that only show there are the
    // client's too, and the cost is paid here rather than in a step.
    m.compute_mask().map_err(|e| invalid(e.to_string()))?;
    if let Some(e) = m.get_error() {
        return Err(invalid(e));
    }
    Ok(CompiledGrammar::new(kind, m))
}
