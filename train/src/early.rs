//! Early stopping: scores every epoch, stops on a condition, keeps the best and latest model on disk.
