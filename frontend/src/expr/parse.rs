//! The expression language of `ndfuse eval` / `ndfuse explain`: a lexer and a
//! hand-written Pratt parser producing an AST in which every node keeps the byte
//! position it starts at, so that any later error can name a column.
//!
//! Precedence follows Python, lowest first:
//!
//! | level | operators                      | associativity            |
//! |-------|--------------------------------|--------------------------|
//! | 1     | `< <= > >= == !=`              | none (chains are refused)|
//! | 2     | `+ -`                          | left                     |
//! | 3     | `* / @`                        | left                     |
//! | 4     | unary `-`, `+`                 | prefix                   |
//! | 5     | `**`                           | right; binds tighter than a unary minus on its left (`-a ** 2` is `-(a ** 2)`), looser than one on its right (`a ** -b`) |
//! | 6     | calls `f(..)`, subscripts `x[..]` | postfix               |
//!
//! # Depth
//!
//! An expression may nest at most [`MAX_DEPTH`] levels: each call, parenthesis, list,
//! unary operator, infix operator in a chain and subscript is a level of the AST, and
//! both this parser and the lowering recurse once per level. Deeper text is refused
//! with `expression nested deeper than 100 levels` at the column where the limit is
//! crossed, so that no input, however deep, can overflow the stack. Why 100: a level
//! costs about 7 KiB of stack to parse and as much to lower in a debug build, and
//! 150 levels were measured to fit a 2 MiB thread (a spawned or test thread; the main
//! thread has 8 MiB), so 100 leaves a third spare there; no real expression nests so.

use std::fmt;

/// A parse or evaluation error at a byte position of the expression.
#[derive(Debug, Clone, PartialEq)]
pub struct ExprError {
    /// Byte offset into the expression.
    pub pos: usize,
    /// What is wrong.
    pub message: String,
}

impl ExprError {
    pub fn new(pos: usize, message: impl Into<String>) -> ExprError {
        ExprError {
            pos,
            message: message.into(),
        }
    }

    /// The 1-based column of `pos` in `src`, counted in characters (not bytes) so that
    /// a caret drawn under the expression lines up.
    pub fn column(&self, src: &str) -> usize {
        let pos = self.pos.min(src.len());
        // `pos` always lies on a char boundary (the lexer only stops on boundaries);
        // fall back to bytes rather than panic if it ever does not.
        src.get(..pos).map_or(pos, |s| s.chars().count()) + 1
    }
}

/// A numeric or boolean literal as written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lit {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lit::Int(v) => write!(f, "{v}"),
            Lit::Float(v) => write!(f, "{v:?}"),
            Lit::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// Binary operators of the surface syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    /// `@`: the matrix product.
    MatMul,
    Pow,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::MatMul => "@",
            BinOp::Pow => "**",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
        }
    }

    fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne
        )
    }
}

/// One item between the brackets of a subscript.
#[derive(Debug, Clone, PartialEq)]
pub enum IndexItem {
    /// `start:stop:step`, each part optional.
    Slice {
        start: Option<Box<Node>>,
        stop: Option<Box<Node>>,
        step: Option<Box<Node>>,
        pos: usize,
    },
    /// A single index: the axis is removed, as in numpy.
    Index(Box<Node>),
}

/// A keyword argument `name=value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Kwarg {
    pub name: String,
    pub pos: usize,
    pub value: Node,
}

/// An AST node and the byte offset of its first character (for an infix operator,
/// the operator's own position: that is where a shape error is best pointed at).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: Kind,
    pub pos: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Lit(Lit),
    /// An input name (or, as a call argument, a dtype name such as `f16`).
    Name(String),
    /// `[a, b, ...]`: shapes, axis lists, pad widths and the tensors of `concat`.
    List(Vec<Node>),
    /// `'reflect'` or `"reflect"`: a string argument such as a pad mode.
    Str(String),
    /// Unary minus (`negate: true`) or plus.
    Unary {
        negate: bool,
        operand: Box<Node>,
    },
    Binary {
        op: BinOp,
        lhs: Box<Node>,
        rhs: Box<Node>,
    },
    Call {
        name: String,
        args: Vec<Node>,
        kwargs: Vec<Kwarg>,
    },
    Subscript {
        base: Box<Node>,
        items: Vec<IndexItem>,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Lit(Lit),
    /// A quoted string, without its quotes.
    Str(String),
    /// Punctuation and operators, by their spelling.
    Sym(&'static str),
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "'{s}'"),
            Tok::Lit(l) => write!(f, "'{l}'"),
            Tok::Str(s) => write!(f, "the string '{s}'"),
            Tok::Sym(s) => write!(f, "'{s}'"),
            Tok::End => f.write_str("the end of the expression"),
        }
    }
}

/// Multi-character symbols first, so that `**` is not read as two `*`.
const SYMBOLS: [&str; 19] = [
    "**", "<=", ">=", "==", "!=", "//", "+", "-", "*", "/", "@", "<", ">", "(", ")", "[", "]", ",",
    ":",
];

fn lex(src: &str) -> Result<Vec<(Tok, usize)>, ExprError> {
    let bytes = src.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &src[start..i];
            let tok = match word {
                "true" | "True" => Tok::Lit(Lit::Bool(true)),
                "false" | "False" => Tok::Lit(Lit::Bool(false)),
                _ => Tok::Ident(word.to_string()),
            };
            toks.push((tok, start));
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let (lit, end) = lex_number(src, start)?;
            toks.push((Tok::Lit(lit), start));
            i = end;
            continue;
        }
        if c == b'\'' || c == b'"' {
            // A string runs to the next quote of the same kind; there are no escapes
            // (no argument needs one).
            let body = start + 1;
            let Some(len) = src[body..].find(char::from(c)) else {
                return Err(ExprError::new(
                    start,
                    format!(
                        "unterminated string: no closing {} for this one",
                        char::from(c)
                    ),
                ));
            };
            toks.push((Tok::Str(src[body..body + len].to_string()), start));
            i = body + len + 1;
            continue;
        }
        if let Some(sym) = SYMBOLS.iter().find(|s| src[i..].starts_with(**s)) {
            if *sym == "//" {
                return Err(ExprError::new(
                    start,
                    "floor division '//' is not supported; use floor(a / b)",
                ));
            }
            toks.push((Tok::Sym(sym), start));
            i += sym.len();
            continue;
        }
        if c == b'=' {
            // A lone `=` only appears in keyword arguments; the parser decides.
            toks.push((Tok::Sym("="), start));
            i += 1;
            continue;
        }
        let ch = src[i..].chars().next().unwrap_or('?');
        let hint = match ch {
            '&' => " (use and(a, b))",
            '|' => " (use or(a, b))",
            '~' | '!' => " (use not(x))",
            '%' => " (there is no modulo op)",
            '.' => " (no attributes or '...': write transpose(x) for x.T)",
            _ => "",
        };
        return Err(ExprError::new(
            start,
            format!("unexpected character '{ch}'{hint}"),
        ));
    }
    toks.push((Tok::End, src.len()));
    Ok(toks)
}

/// Reads `digits [. digits] [e [+-] digits]` (or `.digits ...`) starting at `start`.
fn lex_number(src: &str, start: usize) -> Result<(Lit, usize), ExprError> {
    let b = src.as_bytes();
    let mut i = start;
    let digits = |i: &mut usize| {
        let s = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i > s
    };
    let mut is_float = false;
    digits(&mut i);
    if i < b.len() && b[i] == b'.' {
        is_float = true;
        i += 1;
        digits(&mut i);
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if digits(&mut j) {
            is_float = true;
            i = j;
        } else {
            // `1e` or `1e+`: a malformed exponent, not a number followed by a name.
            let end = j.max(i + 1);
            return Err(ExprError::new(
                start,
                format!(
                    "bad literal '{}': the exponent has no digits",
                    &src[start..end]
                ),
            ));
        }
    }
    // `1.2.3`, `2x`, `3_000`: refuse the whole word rather than lex a number and then
    // report a confusing "unexpected name".
    let mut end = i;
    while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_' || b[end] == b'.') {
        end += 1;
    }
    let text = &src[start..end];
    if end > i {
        return Err(ExprError::new(start, format!("bad literal '{text}'")));
    }
    let lit = if is_float {
        text.parse::<f64>()
            .map(Lit::Float)
            .map_err(|_| ExprError::new(start, format!("bad literal '{text}'")))?
    } else {
        text.parse::<i64>().map(Lit::Int).map_err(|_| {
            ExprError::new(
                start,
                format!("bad literal '{text}': integer out of range (write it as a float, e.g. {text}.0)"),
            )
        })?
    };
    Ok((lit, i))
}

/// The deepest nesting an expression may have (see the module documentation).
pub const MAX_DEPTH: usize = 100;

fn too_deep(pos: usize) -> ExprError {
    ExprError::new(
        pos,
        format!("expression nested deeper than {MAX_DEPTH} levels"),
    )
}

/// Parses a whole expression.
pub fn parse(src: &str) -> Result<Node, ExprError> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks,
        at: 0,
        depth: 0,
    };
    if p.peek() == &Tok::End {
        return Err(ExprError::new(0, "empty expression"));
    }
    let node = p.expr(0)?;
    check_height(&node)?;
    match p.peek() {
        Tok::End => Ok(node),
        Tok::Sym("=") => Err(ExprError::new(
            p.pos(),
            "unexpected '=' (use == to compare; name=value only inside a call)",
        )),
        t => Err(ExprError::new(
            p.pos(),
            format!("unexpected {t} after a complete expression"),
        )),
    }
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    at: usize,
    /// Recursion depth plus the operators of the chains being parsed: at most
    /// [`MAX_DEPTH`], which bounds both this parser's stack and the AST's height (to
    /// about twice the limit; [`check_height`] then holds it to the limit).
    depth: usize,
}

/// The children of a node, for walks that must not recurse.
fn children(n: &Node) -> Vec<&Node> {
    match &n.kind {
        Kind::Lit(_) | Kind::Name(_) | Kind::Str(_) => Vec::new(),
        Kind::List(v) => v.iter().collect(),
        Kind::Unary { operand, .. } => vec![&**operand],
        Kind::Binary { lhs, rhs, .. } => vec![&**lhs, &**rhs],
        Kind::Call { args, kwargs, .. } => {
            args.iter().chain(kwargs.iter().map(|k| &k.value)).collect()
        }
        Kind::Subscript { base, items } => {
            let mut c = vec![&**base];
            for item in items {
                match item {
                    IndexItem::Index(i) => c.push(&**i),
                    IndexItem::Slice {
                        start, stop, step, ..
                    } => c.extend([start, stop, step].into_iter().flatten().map(|b| &**b)),
                }
            }
            c
        }
    }
}

/// Refuses an AST higher than [`MAX_DEPTH`] (a long chain such as `x+1+1+...` is
/// parsed by a loop, not by recursion, yet the lowering recurses once per level),
/// naming the column of the lowest node that crosses the limit. Iterative.
fn check_height(root: &Node) -> Result<(), ExprError> {
    // Post-order with an explicit stack: (node, children pushed?), and the heights of
    // finished children on a second stack.
    let mut stack: Vec<(&Node, bool)> = vec![(root, false)];
    let mut heights: Vec<usize> = Vec::new();
    while let Some((n, expanded)) = stack.pop() {
        let kids = children(n);
        if !expanded {
            stack.push((n, true));
            stack.extend(kids.into_iter().map(|k| (k, false)));
            continue;
        }
        let from = heights.len() - kids.len();
        let h = 1 + heights.drain(from..).max().unwrap_or(0);
        if h > MAX_DEPTH {
            return Err(too_deep(n.pos));
        }
        heights.push(h);
    }
    Ok(())
}

/// Binding power of the operand of a prefix `-`/`+`: above `* /`, below `**`, so that
/// `-a * b` is `(-a) * b` and `-a ** 2` is `-(a ** 2)`.
const PREFIX_BP: u8 = 7;

/// (left, right) binding powers of an infix operator; right < left makes it
/// right-associative.
fn infix_bp(op: BinOp) -> (u8, u8) {
    match op {
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne => (1, 2),
        BinOp::Add | BinOp::Sub => (3, 4),
        // `@` shares `*`'s level and associativity, as in Python.
        BinOp::Mul | BinOp::Div | BinOp::MatMul => (5, 6),
        // The right operand is parsed at PREFIX_BP so that it may start with a unary
        // minus (`2 ** -1`) and so that `a ** b ** c` nests to the right.
        BinOp::Pow => (8, PREFIX_BP),
    }
}

fn binop(t: &Tok) -> Option<BinOp> {
    Some(match t {
        Tok::Sym("+") => BinOp::Add,
        Tok::Sym("-") => BinOp::Sub,
        Tok::Sym("*") => BinOp::Mul,
        Tok::Sym("/") => BinOp::Div,
        Tok::Sym("@") => BinOp::MatMul,
        Tok::Sym("**") => BinOp::Pow,
        Tok::Sym("<") => BinOp::Lt,
        Tok::Sym("<=") => BinOp::Le,
        Tok::Sym(">") => BinOp::Gt,
        Tok::Sym(">=") => BinOp::Ge,
        Tok::Sym("==") => BinOp::Eq,
        Tok::Sym("!=") => BinOp::Ne,
        _ => return None,
    })
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.at].0
    }

    fn peek2(&self) -> &Tok {
        self.toks.get(self.at + 1).map_or(&Tok::End, |t| &t.0)
    }

    fn pos(&self) -> usize {
        self.toks[self.at].1
    }

    fn bump(&mut self) -> (Tok, usize) {
        let t = self.toks[self.at].clone();
        if self.at + 1 < self.toks.len() {
            self.at += 1;
        }
        t
    }

    fn expect(&mut self, sym: &'static str, context: &str) -> Result<usize, ExprError> {
        if self.peek() == &Tok::Sym(sym) {
            Ok(self.bump().1)
        } else {
            Err(ExprError::new(
                self.pos(),
                format!("expected '{sym}' {context}, found {}", self.peek()),
            ))
        }
    }

    /// One more level at `pos`, or the depth error.
    fn deeper(&mut self, pos: usize) -> Result<(), ExprError> {
        if self.depth >= MAX_DEPTH {
            return Err(too_deep(pos));
        }
        self.depth += 1;
        Ok(())
    }

    fn expr(&mut self, min_bp: u8) -> Result<Node, ExprError> {
        let entered = self.depth;
        let node = self.expr_levels(min_bp);
        self.depth = entered;
        node
    }

    /// [`Parser::expr`], whose caller restores the depth.
    fn expr_levels(&mut self, min_bp: u8) -> Result<Node, ExprError> {
        self.deeper(self.pos())?;
        let mut lhs = self.prefix()?;
        while let Some(op) = binop(self.peek()) {
            let (l_bp, r_bp) = infix_bp(op);
            if l_bp < min_bp {
                break;
            }
            self.deeper(self.pos())?;
            let pos = self.bump().1;
            let rhs = self.expr(r_bp)?;
            if op.is_comparison() {
                if let Some(next) = binop(self.peek()).filter(|o| o.is_comparison()) {
                    return Err(ExprError::new(
                        self.pos(),
                        format!(
                            "chained comparison '{}' ... '{}' is not supported; use and(a {} b, b {} c)",
                            op.symbol(),
                            next.symbol(),
                            op.symbol(),
                            next.symbol()
                        ),
                    ));
                }
            }
            lhs = Node {
                kind: Kind::Binary {
                    op,
                    lhs: Box::new(lhs),
                    rhs: Box::new(rhs),
                },
                pos,
            };
        }
        Ok(lhs)
    }

    fn prefix(&mut self) -> Result<Node, ExprError> {
        let negate = match self.peek() {
            Tok::Sym("-") => true,
            Tok::Sym("+") => false,
            _ => return self.postfix(),
        };
        let pos = self.bump().1;
        let operand = self.expr(PREFIX_BP)?;
        Ok(Node {
            kind: Kind::Unary {
                negate,
                operand: Box::new(operand),
            },
            pos,
        })
    }

    fn postfix(&mut self) -> Result<Node, ExprError> {
        let entered = self.depth;
        let node = self.postfix_levels();
        self.depth = entered;
        node
    }

    /// [`Parser::postfix`], whose caller restores the depth.
    fn postfix_levels(&mut self) -> Result<Node, ExprError> {
        let mut node = self.primary()?;
        while self.peek() == &Tok::Sym("[") {
            self.deeper(self.pos())?;
            let open = self.bump().1;
            let items = self.subscript_items(open)?;
            node = Node {
                kind: Kind::Subscript {
                    base: Box::new(node),
                    items,
                },
                pos: open,
            };
        }
        Ok(node)
    }

    fn subscript_items(&mut self, open: usize) -> Result<Vec<IndexItem>, ExprError> {
        let mut items = Vec::new();
        if self.peek() == &Tok::Sym("]") {
            return Err(ExprError::new(open, "empty subscript '[]'"));
        }
        loop {
            items.push(self.index_item()?);
            match self.peek() {
                Tok::Sym(",") => {
                    self.bump();
                    // numpy allows a trailing comma: `x[1:3,]`.
                    if self.peek() == &Tok::Sym("]") {
                        self.bump();
                        return Ok(items);
                    }
                }
                Tok::Sym("]") => {
                    self.bump();
                    return Ok(items);
                }
                t => {
                    return Err(ExprError::new(
                        self.pos(),
                        format!(
                            "expected ',' or ']' in the subscript opened at column {}, found {t}",
                            open + 1
                        ),
                    ))
                }
            }
        }
    }

    fn index_item(&mut self) -> Result<IndexItem, ExprError> {
        let pos = self.pos();
        let bound = |p: &mut Parser| -> Result<Option<Box<Node>>, ExprError> {
            if matches!(p.peek(), Tok::Sym(":" | "," | "]")) {
                Ok(None)
            } else {
                Ok(Some(Box::new(p.expr(0)?)))
            }
        };
        let start = bound(self)?;
        if self.peek() != &Tok::Sym(":") {
            return match start {
                Some(index) => Ok(IndexItem::Index(index)),
                None => Err(ExprError::new(
                    pos,
                    format!("expected an index or a slice, found {}", self.peek()),
                )),
            };
        }
        self.bump();
        let stop = bound(self)?;
        let step = if self.peek() == &Tok::Sym(":") {
            self.bump();
            bound(self)?
        } else {
            None
        };
        Ok(IndexItem::Slice {
            start,
            stop,
            step,
            pos,
        })
    }

    fn primary(&mut self) -> Result<Node, ExprError> {
        let (tok, pos) = self.bump();
        let kind = match tok {
            Tok::Lit(l) => Kind::Lit(l),
            Tok::Str(text) => Kind::Str(text),
            Tok::Ident(name) => {
                if self.peek() == &Tok::Sym("(") {
                    self.bump();
                    let (args, kwargs) = self.call_args(&name, pos)?;
                    Kind::Call { name, args, kwargs }
                } else {
                    Kind::Name(name)
                }
            }
            Tok::Sym("(") => {
                if self.peek() == &Tok::Sym(")") {
                    return Err(ExprError::new(pos, "empty parentheses '()'"));
                }
                let inner = self.expr(0)?;
                self.expect(")", &format!("to close the '(' at column {}", pos + 1))?;
                // Parentheses only group: the inner node keeps its own position.
                return Ok(inner);
            }
            Tok::Sym("[") => {
                let mut elems = Vec::new();
                if self.peek() != &Tok::Sym("]") {
                    loop {
                        elems.push(self.expr(0)?);
                        match self.peek() {
                            Tok::Sym(",") => {
                                self.bump();
                                if self.peek() == &Tok::Sym("]") {
                                    break;
                                }
                            }
                            _ => break,
                        }
                    }
                }
                self.expect(
                    "]",
                    &format!("to close the list opened at column {}", pos + 1),
                )?;
                Kind::List(elems)
            }
            Tok::End => {
                return Err(ExprError::new(
                    pos,
                    "the expression ends where an operand was expected",
                ))
            }
            Tok::Sym(s) => {
                return Err(ExprError::new(
                    pos,
                    format!("expected an operand, found '{s}'"),
                ))
            }
        };
        Ok(Node { kind, pos })
    }

    fn call_args(
        &mut self,
        name: &str,
        name_pos: usize,
    ) -> Result<(Vec<Node>, Vec<Kwarg>), ExprError> {
        let mut args = Vec::new();
        let mut kwargs: Vec<Kwarg> = Vec::new();
        if self.peek() == &Tok::Sym(")") {
            self.bump();
            return Ok((args, kwargs));
        }
        loop {
            if let (Tok::Ident(kw), Tok::Sym("=")) = (self.peek().clone(), self.peek2()) {
                let kw_pos = self.bump().1;
                self.bump();
                if kwargs.iter().any(|k| k.name == kw) {
                    return Err(ExprError::new(
                        kw_pos,
                        format!("keyword '{kw}' given twice in {name}(...)"),
                    ));
                }
                let value = self.expr(0)?;
                kwargs.push(Kwarg {
                    name: kw,
                    pos: kw_pos,
                    value,
                });
            } else {
                let arg_pos = self.pos();
                let value = self.expr(0)?;
                if !kwargs.is_empty() {
                    return Err(ExprError::new(
                        arg_pos,
                        format!("positional argument after a keyword argument in {name}(...)"),
                    ));
                }
                args.push(value);
            }
            match self.peek() {
                Tok::Sym(",") => {
                    self.bump();
                    if self.peek() == &Tok::Sym(")") {
                        self.bump();
                        return Ok((args, kwargs));
                    }
                }
                Tok::Sym(")") => {
                    self.bump();
                    return Ok((args, kwargs));
                }
                t => {
                    return Err(ExprError::new(
                        self.pos(),
                        format!(
                            "expected ',' or ')' in the call of {name} at column {}, found {t}",
                            name_pos + 1
                        ),
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders an AST with explicit parentheses, to check precedence.
    fn show(n: &Node) -> String {
        match &n.kind {
            Kind::Lit(l) => l.to_string(),
            Kind::Name(s) => s.clone(),
            Kind::Str(s) => format!("'{s}'"),
            Kind::List(v) => format!("[{}]", v.iter().map(show).collect::<Vec<_>>().join(", ")),
            Kind::Unary { negate, operand } => {
                format!("({}{})", if *negate { "-" } else { "+" }, show(operand))
            }
            Kind::Binary { op, lhs, rhs } => {
                format!("({} {} {})", show(lhs), op.symbol(), show(rhs))
            }
            Kind::Call { name, args, kwargs } => {
                let mut parts: Vec<String> = args.iter().map(show).collect();
                parts.extend(
                    kwargs
                        .iter()
                        .map(|k| format!("{}={}", k.name, show(&k.value))),
                );
                format!("{name}({})", parts.join(", "))
            }
            Kind::Subscript { base, items } => {
                let opt = |o: &Option<Box<Node>>| o.as_ref().map_or(String::new(), |n| show(n));
                let items: Vec<String> = items
                    .iter()
                    .map(|it| match it {
                        IndexItem::Index(n) => show(n),
                        IndexItem::Slice {
                            start, stop, step, ..
                        } => {
                            format!("{}:{}:{}", opt(start), opt(stop), opt(step))
                        }
                    })
                    .collect();
                format!("{}[{}]", show(base), items.join(", "))
            }
        }
    }

    fn p(s: &str) -> String {
        show(&parse(s).expect("parses"))
    }

    fn col(s: &str) -> (usize, String) {
        let e = parse(s).expect_err("fails");
        (e.column(s), e.message)
    }

    #[test]
    fn python_precedence() {
        assert_eq!(p("-a ** 2"), "(-(a ** 2))");
        assert_eq!(p("a ** b ** c"), "(a ** (b ** c))");
        assert_eq!(p("a ** -b"), "(a ** (-b))");
        assert_eq!(p("-a * b"), "((-a) * b)");
        assert_eq!(p("2 ** 3 * 4"), "((2 ** 3) * 4)");
        assert_eq!(p("a - b - c"), "((a - b) - c)");
        assert_eq!(p("a + b * c < d / e"), "((a + (b * c)) < (d / e))");
        assert_eq!(p("(a + b) * c"), "((a + b) * c)");
        assert_eq!(p("-x[1:2]"), "(-x[1:2:])");
        assert_eq!(p("x[::-1, 0]"), "x[::(-1), 0]");
    }

    #[test]
    fn calls_and_literals() {
        assert_eq!(
            p("sum(x, axis=[0,2], keepdims=true)"),
            "sum(x, axis=[0, 2], keepdims=true)"
        );
        assert_eq!(p("layernorm(x, eps=1e-5)"), "layernorm(x, eps=1e-5)");
        assert_eq!(p(".5 + 5. + 2E3"), "((0.5 + 5.0) + 2000.0)");
        assert_eq!(p("f(a,)"), "f(a)");
        assert_eq!(
            p("pad(x, [[1, 2]], mode='reflect')"),
            "pad(x, [[1, 2]], mode='reflect')"
        );
        assert_eq!(p("f(\"edge\", 'a b')"), "f('edge', 'a b')");
        assert_eq!(
            p("concat([a, b * 2], axis=1)"),
            "concat([a, (b * 2)], axis=1)"
        );
    }

    #[test]
    fn errors_name_columns() {
        assert_eq!(col("a + * b").0, 5);
        assert_eq!(col("a < b < c").0, 7);
        assert_eq!(col("1.2.3 + x"), (1, "bad literal '1.2.3'".into()));
        assert_eq!(
            col("x + 1e"),
            (5, "bad literal '1e': the exponent has no digits".into())
        );
        assert_eq!(col("x & y").0, 3);
        assert_eq!(col("exp(x").0, 6);
        assert_eq!(col("f(a=1, b)").0, 8);
        assert_eq!(col("f(a=1, a=2)").0, 8);
        assert_eq!(col("x // 2").0, 3);
        assert_eq!(col("x = 2").0, 3);
        assert_eq!(col("").0, 1);
        assert_eq!(col("99999999999999999999").0, 1);
        assert_eq!(col("é + (").0, 1);
        assert_eq!(
            col("pad(x, [1, 1], mode='edge)"),
            (21, "unterminated string: no closing ' for this one".into())
        );
        assert_eq!(col("f('a' 'b')").0, 7);
    }

    #[test]
    fn columns_count_characters() {
        let e = ExprError::new(4, "x");
        assert_eq!(e.column("éé + y"), 3);
    }
}
