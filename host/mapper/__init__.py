"""hb_mapper: checker, makertbin and infer."""
