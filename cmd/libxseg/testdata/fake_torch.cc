// A stand-in for PyTorch's libtorch_cuda.so, for testdata/cacheinfo.cc: a
// class with the name, namespace and cacheInfo signature of PyTorch's
// CUDAPluggableAllocator, whose cacheInfo throws as PyTorch's does, among
// other virtual methods. Built as a shared library with the soname
// libtorch_cuda.so.
#include <cstddef>
#include <stdexcept>

namespace torch {
namespace cuda {
namespace CUDAPluggableAllocator {

class Base {
 public:
	virtual ~Base() = default;
	virtual int before() = 0;
	virtual void cacheInfo(signed char device, size_t* largest) = 0;
	virtual int after() = 0;
};

class CUDAPluggableAllocator : public Base {
 public:
	int before() override;
	void cacheInfo(signed char device, size_t* largest) override;
	int after() override;
};

int CUDAPluggableAllocator::before() { return 7; }

void CUDAPluggableAllocator::cacheInfo(signed char, size_t*) {
	throw std::runtime_error("CUDAPluggableAllocator does not yet support cacheInfo");
}

int CUDAPluggableAllocator::after() { return 8; }

}  // namespace CUDAPluggableAllocator
}  // namespace cuda
}  // namespace torch

extern "C" torch::cuda::CUDAPluggableAllocator::Base* fake_make(void) {
	return new torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator();
}
