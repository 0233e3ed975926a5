//! What a benchmark target is (a bound on one figure a run measures) and a verdict on it: a
//! row of the targets' table, met, not met, or not measured (never assumed). The targets
//! themselves are listed in `target_list`; `verdicts` judges what each measurement found.
use super::table::markdown;

/// Which side of its limit a figure must be on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    AtMost,
    Below,
    AtLeast,
}

/// One target: what it bounds, and the bound.
#[derive(Debug)]
pub struct Target {
    /// What it bounds, as the targets table names it.
    pub bounds: &'static str,
    /// The bound in words; it names [`Target::limit`].
    pub bound: &'static str,
    pub side: Side,
    /// In the unit `bound` names.
    pub limit: f64,
    /// How the figure is measured and judged, for docs/BENCHMARKS.md's table.
    pub how: &'static str,
}

impl Target {
    /// Whether `figure`, in the unit of [`Target::bound`], meets it.
    pub fn met_by(&self, figure: f64) -> bool {
        match self.side {
            Side::AtMost => figure <= self.limit,
            Side::Below => figure < self.limit,
            Side::AtLeast => figure >= self.limit,
        }
    }

    /// The row of `figure` for this target, `case` saying where it was measured.
    pub fn judge(&self, case: &str, figure: f64, measured: String) -> Row {
        Row {
            target: self.label(case),
            measured,
            met: Some(self.met_by(figure)),
        }
    }

    /// The row of a measurement that failed: not measured, and why.
    pub fn failed(&self, case: &str, error: &anyhow::Error) -> Row {
        Row {
            target: self.label(case),
            measured: format!("not measured: {error:#}"),
            met: None,
        }
    }

    fn label(&self, case: &str) -> String {
        let label = format!("{} {}", self.bounds, self.bound);
        match case {
            "" => label,
            case => format!("{case}: {label}"),
        }
    }
}

/// One target as a run found it: what it asks, what was measured, and whether that meets it.
pub struct Row {
    pub target: String,
    pub measured: String,
    pub met: Option<bool>,
}

impl Row {
    /// Context beside the targets, judged by none.
    pub fn context(what: &str, measured: String) -> Row {
        Row {
            target: format!("(not a target) {what}"),
            measured,
            met: None,
        }
    }
}

pub fn table(rows: &[Row]) -> String {
    let mut cells = vec![vec!["target".into(), "measured".into(), "met".into()]];
    for row in rows {
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        cells.push(vec![row.target.clone(), row.measured.clone(), met.into()]);
    }
    markdown(&cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(side: Side, limit: f64) -> Target {
        Target {
            bounds: "a figure",
            bound: "in words",
            side,
            limit,
            how: "by hand",
        }
    }

    #[test]
    fn verdicts_follow_the_side() {
        let at_most = target(Side::AtMost, 200.0);
        assert!(at_most.met_by(200.0) && !at_most.met_by(200.1));
        let below = target(Side::Below, 200.0);
        assert!(!below.met_by(200.0) && below.met_by(199.9));
        let at_least = target(Side::AtLeast, 1.0);
        assert!(at_least.met_by(1.0) && !at_least.met_by(0.99));
        let none = target(Side::AtMost, 0.0);
        assert!(none.met_by(0.0) && !none.met_by(1.0));
    }
}
