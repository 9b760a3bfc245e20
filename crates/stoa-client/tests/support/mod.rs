pub mod fake_cluster;
