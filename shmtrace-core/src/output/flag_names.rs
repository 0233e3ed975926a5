//! The flag names of events' lines, made once for each value: a workload repeats the same
//! few (`O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`, `MAP_SHARED`), and making them again,
//! each in a new `String`, for every line was a twentieth of a replay (by callgrind).
use crate::{event::names, model::FastMap};

/// Which kind of flags a value holds: the same number names different flags in each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlagKind {
    Open,
    Prot,
    Map,
    Fallocate,
    Shmget,
    Shmctl,
    Msg,
}

impl FlagKind {
    fn name(self, value: u64) -> String {
        match self {
            FlagKind::Open => names::open_flags(value),
            FlagKind::Prot => names::prot_flags(value),
            FlagKind::Map => names::map_flags(value),
            FlagKind::Fallocate => names::fallocate_mode(value),
            FlagKind::Shmget => names::shmget_flags(value),
            FlagKind::Shmctl => names::shmctl_command(value),
            FlagKind::Msg => names::msg_flags(value),
        }
    }
}

/// Names made so far, by kind and value.
#[derive(Default)]
pub struct FlagNames {
    names: FastMap<(FlagKind, u64), Box<str>>,
}

impl FlagNames {
    /// Values are the program's, so a hostile one could make a new name on every line: past
    /// this many, the names are forgotten and made again.
    const MAX: usize = 4096;

    /// Makes room for the names of one event's line ([`FlagNames::learn`] never forgets).
    pub fn make_room(&mut self) {
        if self.names.len() >= Self::MAX {
            self.names.clear();
        }
    }

    /// Makes the name of `value`, if it is not made yet.
    pub fn learn(&mut self, kind: FlagKind, value: u64) {
        self.names
            .entry((kind, value))
            .or_insert_with(|| kind.name(value).into_boxed_str());
    }

    /// The name of `value`, learnt since the last [`FlagNames::make_room`].
    pub fn get(&self, kind: FlagKind, value: u64) -> &str {
        self.names
            .get(&(kind, value))
            .expect("a flag name learnt for this line")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_as_before_and_kept_within_bounds() {
        let mut names = FlagNames::default();
        for value in 0..3 * FlagNames::MAX as u64 {
            names.make_room();
            names.learn(FlagKind::Open, value);
            names.learn(FlagKind::Prot, value);
            assert_eq!(names.get(FlagKind::Open, value), names::open_flags(value));
            assert_eq!(names.get(FlagKind::Prot, value), names::prot_flags(value));
            assert!(names.names.len() <= FlagNames::MAX + 1);
        }
    }
}
