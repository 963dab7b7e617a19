// Package cufile binds NVIDIA cuFile (GPUDirect Storage) and the few CUDA
// driver calls the GDS validator needs. Both libraries are loaded at run
// time with dlopen (libcufile.so.0 and libcuda.so.1 by default), so the
// binary builds without NVIDIA headers or libraries and runs on hosts that
// have neither; a missing library is an error that wraps ErrNoCufile or
// ErrNoCUDA.
//
// Concurrency: Lib, CUDA and Context methods may be called from many
// goroutines at once; each call makes the context current on its OS thread.
package cufile
