"""The studies, one command each (`python -m experiments.studies.<study>`); a study imports
`experiments.lib` and its own parts (`<study>_grid`, `<study>_report`), never another study."""
