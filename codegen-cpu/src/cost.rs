//! What a compiled kernel executes per element, counted on its optimised Cranelift IR:
//! the numerator of the compute floor of `ndfuse bench`.
//!
//! What is counted, exactly: in each function, the **innermost loops** (loops with no
//! loop inside them: the element loops; per-row and per-band code outside them is not
//! counted). A loop's cost per element is the number of Cranelift instructions in its
//! blocks (every instruction: vector arithmetic, loads, stores, index arithmetic, the
//! compare and branch) divided by the elements one iteration covers. Those elements are
//! read off the loop's loads: the lanes loaded from each input buffer (traced back
//! through `iadd`s to the buffer's pointer in the argument array) per iteration, the
//! largest over the buffers (an unrolled or multi-stream loop loads several vectors of
//! one buffer; a broadcast operand loaded once per row is not in the loop). A loop
//! without such loads is measured by its stores the same way; a loop with neither is
//! not counted. When a function has vector loops (any vector-typed instruction), only
//! they are counted, as its scalar loops are the tails; otherwise its scalar loops
//! are. The costs of the counted loops add up: a row kernel's sweeps (max, sum, store)
//! each visit every element.
//!
//! Cold blocks (the paths inline code takes only for rare arguments: exp's general
//! path, the exact-function calls of sin, cos and pow) are not counted.
//!
//! These are IR instructions, not machine instructions: a few lower to two machine
//! instructions or fold into one (a load into an arithmetic operand), so the figure is
//! an estimate of the work, good to tell a transcendental kernel from a streaming one.

use cranelift_codegen::dominator_tree::DominatorTree;
use cranelift_codegen::flowgraph::ControlFlowGraph;
use cranelift_codegen::ir::{
    ExternalName, Function, Inst, InstructionData, Opcode, Value, ValueDef,
};
use cranelift_codegen::loop_analysis::{Loop, LoopAnalysis};
use std::collections::HashMap;

/// The loops' cost of one function, per element: its own instructions, and the calls
/// it makes (by the callee's `FuncId` index), whose callees' instructions the caller
/// adds when it knows them (the shared out-of-line math of small kernels).
#[derive(Clone, Debug, Default)]
pub(crate) struct LoopCost {
    pub(crate) ops: f64,
    pub(crate) calls: Vec<(u32, f64)>,
}

/// The loops' cost of `func`, per element (see the module docs); `None` when no loop
/// could be measured.
pub(crate) fn ops_per_element(func: &Function) -> Option<LoopCost> {
    let cfg = ControlFlowGraph::with_function(func);
    let domtree = DominatorTree::with_function(func, &cfg);
    let mut loops = LoopAnalysis::new();
    loops.compute(func, &cfg, &domtree);
    let all: Vec<Loop> = loops.loops().collect();
    let innermost = all
        .iter()
        .filter(|&&lp| !all.iter().any(|&c| loops.loop_parent(c) == Some(lp)));
    let (mut vector, mut scalar) = (Vec::new(), Vec::new());
    for &lp in innermost {
        let insts: Vec<Inst> = func
            .layout
            .blocks()
            .filter(|&b| loops.innermost_loop(b) == Some(lp) && !func.layout.is_cold(b))
            .flat_map(|b| func.layout.block_insts(b))
            .collect();
        let Some(elements) = elements_per_iteration(func, &insts) else {
            continue;
        };
        let per = 1.0 / elements as f64;
        let mut cost = LoopCost {
            ops: insts.len() as f64 * per,
            calls: Vec::new(),
        };
        for &i in &insts {
            if let Some(callee) = callee(func, i) {
                cost.calls.push((callee, per));
            }
        }
        if insts.iter().any(|&i| is_vector(func, i)) {
            vector.push(cost);
        } else {
            scalar.push(cost);
        }
    }
    let counted = if vector.is_empty() { scalar } else { vector };
    (!counted.is_empty()).then(|| LoopCost {
        ops: counted.iter().map(|c| c.ops).sum(),
        calls: counted.into_iter().flat_map(|c| c.calls).collect(),
    })
}

/// The `FuncId` index of the function `inst` calls, when it is a call of a named one.
fn callee(func: &Function, inst: Inst) -> Option<u32> {
    let InstructionData::Call { func_ref, .. } = func.dfg.insts[inst] else {
        return None;
    };
    match &func.dfg.ext_funcs[func_ref].name {
        ExternalName::User(r) => Some(func.params.user_named_funcs()[*r].index),
        _ => None,
    }
}

/// Whether `inst` works on vectors (its controlling type or a result is one).
fn is_vector(func: &Function, inst: Inst) -> bool {
    func.dfg.ctrl_typevar(inst).is_vector()
        || func
            .dfg
            .inst_results(inst)
            .iter()
            .any(|&v| func.dfg.value_type(v).is_vector())
}

/// Elements one iteration of a loop made of `insts` covers: the lanes it loads from
/// each buffer, the most of any buffer; else the lanes it stores the same way.
fn elements_per_iteration(func: &Function, insts: &[Inst]) -> Option<u32> {
    let args = func
        .layout
        .entry_block()
        .and_then(|b| func.dfg.block_params(b).first().copied())?;
    let mut loads: HashMap<i32, u32> = HashMap::new();
    let mut stores: HashMap<i32, u32> = HashMap::new();
    for &inst in insts {
        match func.dfg.insts[inst] {
            InstructionData::Load { arg, .. } => {
                let lanes = func
                    .dfg
                    .inst_results(inst)
                    .first()
                    .map_or(1, |&v| func.dfg.value_type(v).lane_count());
                if let Some(slot) = buffer_slot(func, args, arg, 8) {
                    *loads.entry(slot).or_default() += lanes;
                }
            }
            InstructionData::Store {
                args: [value, addr],
                ..
            } => {
                let lanes = func.dfg.value_type(value).lane_count();
                if let Some(slot) = buffer_slot(func, args, addr, 8) {
                    *stores.entry(slot).or_default() += lanes;
                }
            }
            _ => {}
        }
    }
    let most = |m: &HashMap<i32, u32>| m.values().copied().max().filter(|&n| n > 0);
    most(&loads).or_else(|| most(&stores))
}

/// Which buffer `addr` points into: the offset, in the argument array `args`, of the
/// pointer it is computed from by `iadd`s; `None` for any other address (a stack slot,
/// a constant table) or beyond `depth` steps.
fn buffer_slot(func: &Function, args: Value, addr: Value, depth: u32) -> Option<i32> {
    let ValueDef::Result(def, _) = func.dfg.value_def(addr) else {
        return None;
    };
    match func.dfg.insts[def] {
        InstructionData::Load {
            opcode: Opcode::Load,
            arg,
            offset,
            ..
        } if arg == args => Some(offset.into()),
        InstructionData::Binary {
            opcode: Opcode::Iadd,
            args: [a, b],
        } if depth > 0 => {
            buffer_slot(func, args, a, depth - 1).or_else(|| buffer_slot(func, args, b, depth - 1))
        }
        _ => None,
    }
}
