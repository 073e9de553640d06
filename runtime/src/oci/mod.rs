//! The OCI layer: a bundle's spec as torpor reads it ([`spec`]), the
//! `torpor.dev/*` annotations validated into an actor's configuration
//! ([`annotations`]), and what torpor adds to an app container's bundle
//! ([`bundle`]). Imports only [`crate::system`] and [`crate::error`].

pub mod annotations;
pub mod bundle;
pub mod spec;
