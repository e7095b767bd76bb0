p
node3 @(€2'
cuda0CUDA0000:3b:00.0*
0-31,64-95:
mlx5_0OpenFabrics *32-63Blive