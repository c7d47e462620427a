//! Running a compiled element-wise kernel over several disjoint ranges of its domain at
//! once, each after a caller's step on the same worker ([`CompiledKernel::run_units`]):
//! the runtime's matrix products fill a block of the product, then run the epilogue
//! over it while it is in cache, optionally rewriting the output in place
//! ([`CompiledKernel::run_units_in_place`]).

use crate::error::CodegenError;
use crate::jit::{check_array, CompiledKernel, Unit};
use ndfuse_ir::HostArray;
use rayon::prelude::*;

impl CompiledKernel {
    /// The pointers of a call where input `input` is read from output `output`'s array
    /// (see [`Self::run_units_in_place`]), after the checks `checked_pointers` makes
    /// and those the aliasing needs.
    fn aliased_pointers(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
        (input, output): (usize, usize),
    ) -> Result<Vec<*mut u8>, CodegenError> {
        let bad = |detail: String| CodegenError::Args {
            kernel: self.name.clone(),
            detail,
        };
        let reads_in_place = self.read_in_place.get(input).copied().unwrap_or(false);
        if self.outputs.len() != 1
            || output != 0
            || input >= self.inputs.len()
            || self.inputs[input] != self.outputs[output]
            || !reads_in_place
            || inputs.len() + 1 != self.inputs.len()
        {
            return Err(bad(format!(
                "input {input} cannot be read in place from output {output} ({} inputs given for {}, {} outputs)",
                inputs.len(),
                self.inputs.len(),
                self.outputs.len()
            )));
        }
        let [out] = outputs else {
            return Err(bad(format!("expected 1 output, got {}", outputs.len())));
        };
        check_array("output", 0, out, &self.outputs[0]).map_err(bad)?;
        let mut ptrs: Vec<*mut u8> = Vec::with_capacity(self.inputs.len() + 1);
        let mut given = inputs.iter();
        for (k, buffer) in self.inputs.iter().enumerate() {
            if k == input {
                ptrs.push(out.storage_mut().as_mut_ptr());
            } else {
                let a = given.next().ok_or_else(|| bad("too few inputs".into()))?;
                check_array("input", k, a, buffer).map_err(bad)?;
                ptrs.push(a.storage().as_ptr().cast_mut());
            }
        }
        ptrs.push(out.storage_mut().as_mut_ptr());
        Ok(ptrs)
    }

    /// Runs the kernel over several disjoint ranges of positions of its domain at once,
    /// one rayon task per range on the current pool: task `u` first calls `before(u)` on
    /// its worker, then runs the code over `ranges[u]` on that same worker (so what
    /// `before` wrote is still in that core's cache). For the contraction kernels of the
    /// runtime, `before` fills unit `u`'s block of the product.
    ///
    /// Only for kernels without reduce axes and of one stage (not split); anything else
    /// is [`CodegenError::Args`]. Arguments are checked once, as [`Self::run`] checks
    /// them, and `ranges` must be sorted, disjoint and within `0..numel`; nothing runs
    /// when a check fails. The first error of a `before` is returned (other tasks may
    /// have run by then; a task whose `before` fails does not run the code). Each range
    /// is one call of the code on one thread, whichever thread: when the ranges depend on
    /// shapes only, so do the calls, and the outputs are the same bits whatever the
    /// thread count.
    pub fn run_units<E>(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
        ranges: &[std::ops::Range<usize>],
        before: impl Fn(usize) -> Result<(), E> + Sync,
    ) -> Result<(), E>
    where
        E: From<CodegenError> + Send,
    {
        self.units(inputs, outputs, None, ranges, before)
    }

    /// [`Self::run_units`] with input `input` read from output `output`'s array, in
    /// place: `inputs` holds every input but that one. For a matrix product's
    /// epilogue whose one output has the product's dtype and length, so the GEMM fills
    /// the output itself and the epilogue rewrites each element where it is (no scratch
    /// the size of the output, and no second stream of it through memory).
    ///
    /// Refused ([`CodegenError::Args`]) unless the kernel has one output, of the same
    /// dtype and length as input `input`, and loads that input only at each position's
    /// own offset (the contiguous view of the domain), so that the code of a position
    /// reads its element before it writes it and touches no other position's.
    pub fn run_units_in_place<E>(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
        (input, output): (usize, usize),
        ranges: &[std::ops::Range<usize>],
        before: impl Fn(usize) -> Result<(), E> + Sync,
    ) -> Result<(), E>
    where
        E: From<CodegenError> + Send,
    {
        self.units(inputs, outputs, Some((input, output)), ranges, before)
    }

    fn units<E>(
        &self,
        inputs: &[&HostArray],
        outputs: &mut [&mut HostArray],
        aliased: Option<(usize, usize)>,
        ranges: &[std::ops::Range<usize>],
        before: impl Fn(usize) -> Result<(), E> + Sync,
    ) -> Result<(), E>
    where
        E: From<CodegenError> + Send,
    {
        let bad = |detail: String| {
            E::from(CodegenError::Args {
                kernel: self.name.clone(),
                detail,
            })
        };
        let [stage] = &self.stages[..] else {
            return Err(bad(format!(
                "run_units needs a kernel of one stage, this one has {}",
                self.stages.len()
            )));
        };
        if self.unit != Unit::Positions || self.scratch_slots != 0 {
            return Err(bad(
                "run_units needs a kernel without reduce axes".to_string()
            ));
        }
        let mut prev_end = 0;
        for r in ranges {
            if r.start < prev_end || r.start > r.end || r.end > self.extent {
                return Err(bad(format!(
                    "ranges must be sorted, disjoint and within {} 0..{}: {}..{} after ..{prev_end}",
                    self.unit.name(),
                    self.extent,
                    r.start,
                    r.end
                )));
            }
            prev_end = r.end;
        }
        let ptrs = match aliased {
            None => self.checked_pointers(inputs, outputs, &mut [], 0, self.extent),
            Some((input, output)) => self.aliased_pointers(inputs, outputs, (input, output)),
        }
        .map_err(E::from)?;
        let entry = &stage.entry;

        /// The pointer array shared by the tasks of one `run_units` call (only it
        /// builds one).
        struct UnitPtrs<'a>(&'a [*mut u8]);
        impl UnitPtrs<'_> {
            /// A method, so that closures capture the `Sync` wrapper, not the slice.
            fn get(&self) -> &[*mut u8] {
                self.0
            }
        }
        // SAFETY: the tasks that share the array write disjoint elements and never
        // write what another reads: the kernel has one stage and no reduce axes
        // (checked above), so a call over positions `[start, end)` writes only the
        // output elements at those positions, and the ranges are disjoint (checked
        // above); the code only reads inputs (never writes through an input pointer),
        // and outputs are distinct from inputs and from each other (borrowed `&mut`
        // here for the whole call), but for `run_units_in_place`'s one input read
        // where the one output is: the code loads that input only at each position's
        // own offset (`aliased_pointers` checked `read_in_place`), and every value of a
        // position is computed from its loads before the store of that position, so a
        // task reads an element of that array before it writes it, and only within
        // its own range. The arrays stay borrowed until `try_for_each`
        // returns, which is after every task has finished, so no pointer outlives them.
        unsafe impl Sync for UnitPtrs<'_> {}

        let shared = UnitPtrs(&ptrs);
        let as_i64 = |v: usize| i64::try_from(v).expect("numel fits i64: checked by supports()");
        (0..ranges.len()).into_par_iter().try_for_each(|u| {
            before(u)?;
            let r = &ranges[u];
            if r.start < r.end {
                // SAFETY: `checked_pointers` (or `aliased_pointers`, for an input read
                // in place from the output: see `UnitPtrs`) checked, before building the
                // pointers, one pointer per kernel buffer (inputs, then outputs), each to
                // an array of the buffer's dtype and exact length, outputs distinct; the
                // kernel has no scratch (checked above). `0 <= start < end <= numel`
                // (checked above), and `supports` proved every load of every domain
                // position inside its buffer; stores go to positions `< numel` of
                // outputs of `numel` elements. Calls running at once on other threads
                // cover disjoint ranges, so they write disjoint elements (see
                // `UnitPtrs`). Bool outputs receive only 0 or 1.
                unsafe { entry.call(shared.get(), as_i64(r.start), as_i64(r.end)) };
            }
            Ok(())
        })
    }
}
