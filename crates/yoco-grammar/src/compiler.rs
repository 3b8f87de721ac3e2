//! Compiling constraints once per tokenizer, off the step loop, under a budget; cached by canonical text.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llguidance::toktrie::TokenId;
use llguidance::{Matcher, ParserFactory};
use rustc_hash::FxHashMap;

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
        Self {
            time_budget_ms: 10_000,
            max_grammar_size: 500_000,
            initial_lexer_fuel: 1_000_000,
            max_in_flight: 4,
            cache_size: 256,
        }
    }
}

/// Donations a template takes before it starts again from the pristine compiled grammar (bounds the
/// growth of its lexer cache over a long-lived server's life).
const TEMPLATE_DONATIONS: u64 = 256;

/// A compiled constraint: the template each sequence that uses it forks its own matcher from.
///
/// llguidance keeps a grammar's lexer cache (lazily built DFA states) behind a mutex that the whole
/// mask computation holds, shared by shallow clones of a matcher. Rows sharing one cache therefore
/// compute their masks one at a time. Instead each sequence *forks* (deep-clones) a warm template: its
/// own copy of the cache, so rows of one grammar run in parallel, and a new sequence still starts
/// warm (at 262k tokens a cold DFA state costs milliseconds, a warm mask tens of µs). When a sequence
/// ends, its matcher, rewound to the start, is offered back as the next template
/// ([`CompiledGrammar::donate`]), so what one sequence learned warms the ones that follow.
pub struct CompiledGrammar {
    pub kind: GrammarKind,
    pristine: Matcher,
    template: Mutex<Template>,
}

struct Template {
    matcher: Matcher,
    /// Donations this template descends from (ever increasing); a donor forked from an older template
    /// (with less in its cache) is refused, so the cache only grows along one line until the periodic
    /// restart, which older donors cannot undo.
    lineage: u64,
}

/// A sequence's own matcher and the template lineage it was forked from (for [`CompiledGrammar::donate`]).
pub struct Fork {
    pub matcher: Matcher,
    pub lineage: u64,
}

impl CompiledGrammar {
    fn new(kind: GrammarKind, m: Matcher) -> Self {
        let template = Mutex::new(Template {
            matcher: m.deep_clone(),
            lineage: 0,
        });
        Self {
            kind,
            pristine: m,
            template,
        }
    }

    /// A new matcher at the start of the grammar with its own copy of the template's lexer cache.
    pub fn fork(&self) -> Fork {
        let t = self.template.lock().unwrap_or_else(|e| e.into_inner());
        Fork {
            matcher: t.matcher.deep_clone(),
            lineage: t.lineage,
        }
    }

    /// Offer a finished sequence's matcher as the next template: rewound to the start, it carries the
    /// template's cache plus the DFA states the sequence built. Refused when it failed, cannot rewind,
    /// or was forked from an older template than the current one; every `TEMPLATE_DONATIONS` the
    /// template starts again from the pristine grammar. Returns whether it was taken.
    pub fn donate(&self, fork: Fork) -> bool {
        let Fork {
            mut matcher,
            lineage,
        } = fork;
        if matcher.is_error() || matcher.reset().is_err() || matcher.is_stopped() {
            return false;
        }
        let mut t = self.template.lock().unwrap_or_else(|e| e.into_inner());
        if lineage < t.lineage {
            return false;
        }
        let next = lineage + 1;
        let matcher = if next % TEMPLATE_DONATIONS == 0 {
            self.pristine.deep_clone()
        } else {
            matcher
        };
        *t = Template {
            matcher,
            lineage: next,
        };
        true
    }

    /// How many donations the current template descends from (tests, diagnostics).
    pub fn template_lineage(&self) -> u64 {
        self.template
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lineage
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
    pub fn from_tokenizer_json(
        json: &[u8],
        vocab_size: usize,
        eos_ids: &[u32],
        limits: CompileLimits,
    ) -> Result<Self, GrammarError> {
        let (env, eos) = crate::tokenizer::tok_env(json, vocab_size, eos_ids)?;
        let n = env.tok_trie().vocab_size();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        factory.quiet();
        let l = factory.limits_mut();
        l.max_grammar_size = limits.max_grammar_size;
        l.initial_lexer_fuel = limits.initial_lexer_fuel;
        Ok(Self {
            factory: Arc::new(factory),
            limits,
            cache: Mutex::new(Cache::default()),
            in_flight: Arc::new(AtomicUsize::new(0)),
            vocab_size: n,
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
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .len()
    }

    /// Compile `spec` (or take it from the cache). Runs on its own thread; the caller waits at most
    /// the time budget. Blocking: call it off the step loop.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Arc<CompiledGrammar>, GrammarError> {
        let key = (spec.kind, spec.canonical.clone());
        if let Some(g) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .get(&key)
        {
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

fn compile_now(
    factory: &ParserFactory,
    kind: GrammarKind,
    grammar: llguidance::api::TopLevelGrammar,
) -> Result<CompiledGrammar, GrammarError> {
    let invalid = |message: String| GrammarError::Invalid {
        kind: kind.name(),
        message,
    };
    let parser = factory
        .create_parser(grammar)
        .map_err(|e| invalid(e.to_string()))?;
    let mut m = Matcher::new(Ok(parser));
    // The first mask builds the lexer's initial states: errors that only show there are the
    // client's too, and the cost is paid here rather than in a step.
    m.compute_mask().map_err(|e| invalid(e.to_string()))?;
    if let Some(e) = m.get_error() {
        return Err(invalid(e));
    }
    Ok(CompiledGrammar::new(kind, m))
}
