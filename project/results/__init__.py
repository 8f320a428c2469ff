"""What a trained run gives: exported files, evaluation, prediction, figures."""
