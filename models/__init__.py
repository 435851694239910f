"""Everything that holds weights: model references, profiles, backends and encoders."""
